"""Retry decisions after a failed attempt: pure arithmetic, clock- and rng-free."""

from __future__ import annotations

import dataclasses
import random

from agora_pg.jobs import will_retry


MAX_RETRY_DELAY_SECONDS = 365 * 24 * 3600.0  # the longest delay a retry is given


@dataclasses.dataclass(frozen=True)
class BackoffPolicy:
    """Exponential backoff with equal jitter.

    The n-th failure (n >= 1) waits ``d = min(max_seconds, base_seconds * 2**(n-1))``
    scaled by a uniform factor in ``[1 - jitter, 1]``; ``jitter=0.5`` gives a
    delay in ``[d/2, d]``.
    """

    base_seconds: float = 2.0
    max_seconds: float = 3600.0
    jitter: float = 0.5

    def __post_init__(self) -> None:
        if self.base_seconds < 0 or self.max_seconds < 0:
            raise ValueError("backoff seconds must be >= 0")
        if not 0.0 <= self.jitter <= 1.0:
            raise ValueError("jitter must be between 0 and 1")

    def delay(self, failures: int, rng: random.Random) -> float:
        """Seconds to wait before the attempt that follows ``failures`` failures."""
        if failures < 1:
            raise ValueError("failures must be >= 1")
        exponent = min(failures - 1, 62)  # 2**62 s is already past any cap
        ceiling = min(self.max_seconds, self.base_seconds * (2.0**exponent))
        return ceiling * (1.0 - self.jitter * rng.random())


@dataclasses.dataclass(frozen=True)
class RetryDecision:
    """Run the job again ``delay_seconds`` after now."""

    delay_seconds: float


def decide(
    failures: int,
    max_retries: int,
    policy: BackoffPolicy,
    rng: random.Random,
    requested_delay: float | None = None,
) -> RetryDecision | None:
    """Decide what follows a failed attempt; ``None`` means the job is finished.

    ``failures`` is the job's ``retry_count`` including this failure.
    ``requested_delay`` is the delay of a ``Retry`` the handler raised, used instead
    of ``policy`` (at most ``MAX_RETRY_DELAY_SECONDS``: ``Retry(float('inf'))``
    waits a year).
    """
    if not will_retry(failures, max_retries):
        return None
    if requested_delay is not None:
        return RetryDecision(min(requested_delay, MAX_RETRY_DELAY_SECONDS))
    return RetryDecision(policy.delay(failures, rng))
