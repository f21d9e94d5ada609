import random

import pytest

from agora_pg.errors import Retry
from agora_pg.retry import MAX_RETRY_DELAY_SECONDS, BackoffPolicy, RetryDecision, decide


class FixedRandom(random.Random):
    def __init__(self, value: float) -> None:
        super().__init__()
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.mark.parametrize(
    ("failures", "low", "high"),
    [(1, 1.0, 2.0), (2, 2.0, 4.0), (3, 4.0, 8.0), (6, 32.0, 64.0), (7, 50.0, 100.0), (40, 50.0, 100.0)],
)
def test_backoff_doubles_per_failure_within_jitter_and_cap(failures: int, low: float, high: float) -> None:
    policy = BackoffPolicy(base_seconds=2.0, max_seconds=100.0, jitter=0.5)
    assert policy.delay(failures, FixedRandom(0.0)) == pytest.approx(high)
    assert policy.delay(failures, FixedRandom(1.0)) == pytest.approx(low)
    assert low <= policy.delay(failures, random.Random(failures)) <= high


def test_backoff_rejects_nonsense() -> None:
    with pytest.raises(ValueError):
        BackoffPolicy(base_seconds=-1)
    with pytest.raises(ValueError):
        BackoffPolicy(jitter=1.5)
    with pytest.raises(ValueError):
        BackoffPolicy().delay(0, random.Random())


def test_decide_retries_below_max_and_stops_at_max() -> None:
    policy = BackoffPolicy(base_seconds=1.0, jitter=0.0)
    rng = random.Random(0)
    assert decide(1, 3, policy, rng) == RetryDecision(1.0)
    assert decide(2, 3, policy, rng) == RetryDecision(2.0)
    assert decide(3, 3, policy, rng) is None
    assert decide(1, 0, policy, rng) is None


def test_a_requested_delay_replaces_the_backoff_and_is_capped() -> None:
    decision = decide(1, 3, BackoffPolicy(), random.Random(0), Retry(42.5).delay_seconds)
    assert decision == RetryDecision(42.5)
    assert decide(3, 3, BackoffPolicy(), random.Random(0), 42.5) is None
    assert decide(1, 3, BackoffPolicy(), random.Random(0), float("inf")) == RetryDecision(MAX_RETRY_DELAY_SECONDS)
    for bad in (-1, float("nan")):
        with pytest.raises(ValueError):
            Retry(bad)
