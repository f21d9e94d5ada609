"""The CLI's event loop runner."""

from __future__ import annotations

import sys

import pytest

from agora_pg.cli import run_event_loop


@pytest.mark.parametrize("uvloop_installed", [True, False])
def test_an_error_out_of_the_loop_carries_no_import_error_as_its_context(
    uvloop_installed: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run outside the optional import's ``except``: a traceback never shows a missing
    uvloop (as if it were needed) under an error of the user's."""
    if not uvloop_installed:
        monkeypatch.setitem(sys.modules, "uvloop", None)  # (import uvloop raises ImportError)

    async def fails() -> None:
        raise LookupError("the user's own error")

    with pytest.raises(LookupError) as raised:
        run_event_loop(fails())
    assert raised.value.__context__ is None and raised.value.__cause__ is None
