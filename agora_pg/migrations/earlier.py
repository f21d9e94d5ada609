"""An earlier migration's module, for a revision that builds on its statements (a
function it replaces, or brings back on downgrade)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

VERSIONS = Path(__file__).with_name("versions")


def migration(name: str) -> ModuleType:
    """The module of ``versions/{name}.py`` (such as ``0017_fair_share``), loaded from its file."""
    spec = importlib.util.spec_from_file_location(f"migration_{name}", VERSIONS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
