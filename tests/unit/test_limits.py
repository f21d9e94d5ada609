"""The bounds of flow-control limits (agora_pg/limits.py), whichever way they are declared."""

from __future__ import annotations

import math

import pytest

from agora_pg.errors import InvalidJob
from agora_pg.limits import MAX_LIMIT, MAX_RATE_SECONDS, InvalidLimit, KindLimit, QueueLimit
from agora_pg.worker.handlers import Handlers


@pytest.mark.parametrize("concurrency", [0, -1, MAX_LIMIT + 1, 2**31, 1.5, True, "2"])
def test_a_concurrency_out_of_bounds_is_refused(concurrency: object) -> None:
    for build in (lambda: KindLimit(concurrency), lambda: QueueLimit(concurrency)):  # type: ignore[arg-type]
        with pytest.raises(InvalidLimit) as caught:
            build()
        assert caught.value.field == "concurrency"


@pytest.mark.parametrize("rate", [(1, math.nan), (1, math.inf), (1, -math.inf), (1, 1e300), (1, 1e12),
                                  (1, MAX_RATE_SECONDS + 1), (1, 0.0001), (0, 60), (MAX_LIMIT + 1, 60),
                                  (1.0, 60), (1, True), (1,), "100/min", None and (1, 1)])
def test_a_rate_out_of_bounds_is_refused(rate: object) -> None:
    if rate is None:
        assert KindLimit(rate=None).rate is None
        return
    with pytest.raises(InvalidLimit, match=r"^rate: expected \(starts, seconds\)"):
        QueueLimit(rate=rate)  # type: ignore[arg-type]


def test_limits_within_bounds_are_kept_with_float_windows() -> None:
    assert QueueLimit(MAX_LIMIT, (MAX_LIMIT, 86_400)).rate == (MAX_LIMIT, 86_400.0)
    assert KindLimit(1, "tenant", [5, 0.001], "tenant").rate == (5, 0.001)  # type: ignore[arg-type]  # (TOML's array)
    assert KindLimit() == KindLimit(None, None, None, None)


def test_key_fields_are_names_and_limit_by_needs_a_limit() -> None:
    for field in ("limit_by", "fair_by"):
        for bad in ("", " ", "x" * 201, "a\nb", 3):
            with pytest.raises(InvalidLimit) as caught:
                KindLimit(concurrency=1, **{field: bad})  # type: ignore[arg-type]
            assert caught.value.field == field
    with pytest.raises(InvalidLimit, match="^limit_by: 'tenant' needs a concurrency or rate limit"):
        KindLimit(limit_by="tenant")


def test_handlers_say_which_kind_or_queue_is_wrong() -> None:
    handlers = Handlers()
    with pytest.raises(InvalidLimit, match=r"^rate: .* \(kind 'mail'\)$"):
        handlers.add("mail", print, rate=(1, math.nan))
    with pytest.raises(InvalidLimit, match=r"^concurrency: .*got 2147483648 \(queue 'mail'\)$"):
        handlers.queue("mail", concurrency=2**31)
    with pytest.raises(InvalidJob, match="^kind: longer than 1000 characters \\(kind 'x{60}…'\\)$"):
        handlers.add("x" * 10_000, print)
    assert handlers.queue_limits() == {} and len(handlers) == 0  # nothing half-registered
