"""Every way out of an attempt becomes one storable Outcome."""

import asyncio

import pytest

from agora_pg.errors import Fail, Retry
from agora_pg.outcomes import (
    MAX_ERROR_MESSAGE,
    MAX_TRACEBACK,
    Outcome,
    OutcomeKind,
    StopReason,
    describe_error,
    outcome_of,
    storable_text,
    thread_left_running,
)


def raised(error: BaseException) -> BaseException:
    """``error`` with a traceback, as a handler's would have."""
    try:
        raise error
    except BaseException as caught:
        return caught


def test_describe_error_gives_type_and_text() -> None:
    assert describe_error(ValueError("bad value")) == ("ValueError", "ValueError: bad value")
    assert describe_error(KeyError()) == ("KeyError", "KeyError")
    assert len(describe_error(RuntimeError("x" * 10_000))[1]) == MAX_ERROR_MESSAGE


@pytest.mark.parametrize(
    ("text", "stored"),
    [
        ("nul \x00 inside", "nul \\x00 inside"),
        ("lone \udc80 surrogate", "lone \\udc80 surrogate"),
        ("plain é ✓", "plain é ✓"),
    ],
)
def test_text_postgresql_cannot_hold_is_replaced(text: str, stored: str) -> None:
    assert storable_text(text, 100) == stored
    stored.encode("utf-8")  # storable: valid UTF-8, no NUL


def test_storable_text_is_capped() -> None:
    assert storable_text("y" * 50, 10) == "yyyyyyy..."


def test_an_error_whose_str_raises_still_has_an_outcome() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    outcome = outcome_of(raised(Unprintable()))
    assert outcome.kind is OutcomeKind.FAILED
    assert outcome.error_message == "Unprintable: <unprintable Unprintable: RuntimeError>"


def test_success_and_failure() -> None:
    assert outcome_of(None) == Outcome(OutcomeKind.SUCCEEDED)
    failed = outcome_of(raised(ValueError("bad \x00 input")))
    assert (failed.kind, failed.error_type, failed.error_message, failed.final) == (
        OutcomeKind.FAILED, "ValueError", "ValueError: bad \\x00 input", False,
    )
    assert failed.traceback is not None and "raise error" in failed.traceback and "\x00" not in failed.traceback


def test_tracebacks_keep_their_innermost_end_within_the_cap() -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise LookupError("the bottom")
        deep(n - 1)

    try:
        deep(600)
    except LookupError as error:
        outcome = outcome_of(error)
    assert outcome.traceback is not None and len(outcome.traceback) <= MAX_TRACEBACK
    assert outcome.traceback.rstrip().endswith("LookupError: the bottom")


def test_fail_and_listed_types_are_final() -> None:
    assert outcome_of(raised(Fail("bad card"))).final
    assert outcome_of(raised(KeyError("k")), non_retryable=(LookupError,)).final
    assert not outcome_of(raised(KeyError("k")), non_retryable=(ValueError,)).final


def test_retry_carries_its_delay() -> None:
    outcome = outcome_of(raised(Retry(12.5, "later")))
    assert (outcome.kind, outcome.retry_after, outcome.error_message) == (OutcomeKind.FAILED, 12.5, "Retry: later")


def test_a_handler_raising_cancelled_error_itself_is_a_failure() -> None:
    outcome = outcome_of(raised(asyncio.CancelledError()))
    assert outcome.kind is OutcomeKind.FAILED and outcome.error_type == "CancelledError"
    assert "did not cancel it" in (outcome.error_message or "")


@pytest.mark.parametrize(
    ("reason", "kind", "error_type"),
    [
        (StopReason.TIMEOUT, OutcomeKind.FAILED, "JobTimeout"),
        (StopReason.CANCEL_REQUESTED, OutcomeKind.CANCELLED, "JobCancelled"),
        (StopReason.LEASE_LOST, OutcomeKind.LOST, "LeaseLost"),
        (StopReason.LEASE_UNRENEWED, OutcomeKind.LOST, "LeaseLost"),
        (StopReason.SHUTDOWN, OutcomeKind.RELEASED, "WorkerShutdown"),
    ],
)
def test_a_stop_by_agora_decides_the_outcome_whatever_the_handler_raised(
    reason: StopReason, kind: OutcomeKind, error_type: str
) -> None:
    for error in (raised(asyncio.CancelledError()), raised(ValueError("cleanup failed")), None):
        outcome = outcome_of(error, reason, timeout_seconds=2.5)
        assert (outcome.kind, outcome.error_type) == (kind, error_type)
    assert outcome_of(None, StopReason.TIMEOUT, timeout_seconds=2.5).error_message == (
        "JobTimeout: the attempt ran longer than its timeout of 2.5s and was cancelled"
    )
    assert outcome_of(None, reason).kind is not OutcomeKind.SUCCEEDED  # never recorded as succeeded


def test_an_attempt_whose_thread_was_left_running_names_it_and_holds_its_retry_back() -> None:
    stopped = outcome_of(asyncio.CancelledError(), StopReason.TIMEOUT, timeout_seconds=5)
    left = thread_left_running(stopped, "agora-job-12", 30, retry_at_least=130)
    assert (left.kind, left.error_type, left.final, left.retry_at_least) == (OutcomeKind.FAILED, "JobTimeout", False, 130)
    assert left.error_message.startswith(stopped.error_message + "; its thread agora-job-12 had not returned 30s later")
    cancelled = thread_left_running(outcome_of(None, StopReason.CANCEL_REQUESTED), "agora-job-3", 30, 130)
    assert cancelled.kind is OutcomeKind.CANCELLED  # (no retry follows: nothing to hold back)
