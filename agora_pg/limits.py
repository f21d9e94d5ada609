"""Flow-control limits as declared (``handlers.kind``, ``handlers.queue``, a config's
``[kinds]`` and ``[queues]``), each checked here within its bounds. No I/O."""

from __future__ import annotations

import dataclasses
import math

MAX_LIMIT = 1_000_000
MIN_RATE_SECONDS = 0.001
MAX_RATE_SECONDS = 86_400.0  # a day
MAX_FIELD_NAME = 200


class InvalidLimit(ValueError):
    """A limit out of bounds: ``field`` names it, ``reason`` says why."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field, self.reason = field, reason


@dataclasses.dataclass(frozen=True)
class QueueLimit:
    """A queue's limits (``agora.queue_limits``): at most ``concurrency`` of its jobs
    running and ``rate`` = (n, seconds) starts per window, of every kind together. Both
    None: none."""

    concurrency: int | None = None
    rate: tuple[int, float] | None = None

    def __post_init__(self) -> None:
        _check_concurrency(self.concurrency)
        object.__setattr__(self, "rate", _checked_rate(self.rate))


@dataclasses.dataclass(frozen=True)
class KindLimit:
    """A kind's flow control (``agora.kind_limits``): at most ``concurrency`` running and
    ``rate`` = (n, seconds) starts per window, per value of the payload field ``limit_by``
    (None: the kind as a whole); its jobs taken one per value of ``fair_by`` (else
    ``limit_by``) in turn. All None: none."""

    concurrency: int | None = None
    limit_by: str | None = None
    rate: tuple[int, float] | None = None
    fair_by: str | None = None

    def __post_init__(self) -> None:
        _check_concurrency(self.concurrency)
        object.__setattr__(self, "rate", _checked_rate(self.rate))
        for field in ("limit_by", "fair_by"):
            value = getattr(self, field)
            if value is not None and not (isinstance(value, str) and value.strip() and value.isprintable()
                                          and len(value) <= MAX_FIELD_NAME):
                raise InvalidLimit(field, f"expected the name of a payload field (printable, at most {MAX_FIELD_NAME} "
                                          f"characters), got {value!r:.80}")
        if self.limit_by is not None and self.concurrency is None and self.rate is None:
            raise InvalidLimit("limit_by", f"{self.limit_by!r} needs a concurrency or rate limit to count by it")


def _whole(value: object, low: int, high: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _check_concurrency(value: object) -> None:
    if value is not None and not _whole(value, 1, MAX_LIMIT):
        raise InvalidLimit("concurrency", f"expected a whole number from 1 to {MAX_LIMIT:,}, got {value!r}")


def _checked_rate(value: object) -> tuple[int, float] | None:
    """``(starts, seconds)``, seconds as a float (a list of two is taken too: TOML's array)."""
    if value is None:
        return None
    starts, seconds = value if isinstance(value, tuple | list) and len(value) == 2 else (None, None)
    if not (_whole(starts, 1, MAX_LIMIT) and isinstance(seconds, int | float) and not isinstance(seconds, bool)
            and math.isfinite(seconds) and MIN_RATE_SECONDS <= seconds <= MAX_RATE_SECONDS):
        raise InvalidLimit("rate", f"expected (starts, seconds) with starts a whole number from 1 to {MAX_LIMIT:,} "
                                   f"and seconds from {MIN_RATE_SECONDS:g} to {MAX_RATE_SECONDS:,.0f} (a day), "
                                   f"such as (100, 60); got {value!r}")
    return (starts, float(seconds))  # type: ignore[return-value]
