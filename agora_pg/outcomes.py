"""How an attempt ended, as values the database can always store. Pure: no I/O.

Every way out of a job attempt or a pipeline run (return, exception, the
handler's own ``CancelledError``, timeout, a cancel request, a lost lease,
shutdown) is turned into one ``Outcome`` by ``outcome_of``; the worker and the
pipeline runner then record it through one statement each. Text that
PostgreSQL cannot store (NUL characters, lone surrogates) is replaced here, so
no outcome statement can fail on its data.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import json
import traceback as tracebacks
from collections.abc import Collection
from typing import Any

from agora_pg.errors import Fail, PipelineInterrupted, Retry
from agora_pg.job_spec import holds_nul
from agora_pg.payloads import to_json_object

MAX_ERROR_MESSAGE = 4000  # characters of "Type: text" kept in error_message
MAX_TRACEBACK = 16000  # characters of a traceback kept in agora.runs.traceback


class StopReason(str, enum.Enum):
    """Why agora-pg itself stopped an attempt before it ended on its own."""

    SHUTDOWN = "shutdown"  # the worker is stopping and the grace period is over
    TIMEOUT = "timeout"  # the attempt ran longer than its timeout
    CANCEL_REQUESTED = "cancel_requested"  # POST /jobs/{id}/cancel, agora-pg jobs cancel
    LEASE_LOST = "lease_lost"  # another worker took the job or run over
    LEASE_UNRENEWED = "lease_unrenewed"  # the lease could not be renewed: stopped before it expires


class OutcomeKind(str, enum.Enum):
    """What is recorded for an attempt (its ``agora.runs`` status in brackets)."""

    SUCCEEDED = "succeeded"  # [succeeded] the job is done
    FAILED = "failed"  # [failed] counts towards max_retries; retried after a delay unless final
    CANCELLED = "cancelled"  # [cancelled] stopped on request: the job is cancelled, not retried
    LOST = "lost"  # [abandoned] the lease was lost or could not be renewed: counts as a lost attempt
    RELEASED = "released"  # [cancelled] cut short at shutdown: due again at once, counts as a lost attempt


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one attempt ended. For ``FAILED``: ``final`` means no retry follows, and
    ``retry_after`` is a delay the handler chose (``Retry``) instead of the backoff, and
    ``retry_at_least`` the shortest delay a retry may have, whatever the backoff says."""

    kind: OutcomeKind
    error_type: str | None = None
    error_message: str | None = None
    traceback: str | None = None
    final: bool = False
    retry_after: float | None = None
    result: str | None = None  # SUCCEEDED: what the handler returned, as JSON text
    retry_at_least: float = 0.0
    intended: bool = False  # the handler raised Fail: its message is the reason (its traceback is in the run)


SUCCEEDED = Outcome(OutcomeKind.SUCCEEDED)


def succeeded_with(value: Any) -> tuple[Outcome, str | None]:
    """The outcome of a handler that returned ``value``, which is stored as the attempt's
    result (JSON). Dataclasses and ``msgspec.Struct`` values are stored as objects, and
    datetimes, UUIDs and decimals as text (``payloads.to_json_object``). A value JSON
    cannot hold, or PostgreSQL's jsonb cannot (a NUL character), is not stored: the
    attempt still succeeded (its work is done), and the problem comes back for the log."""
    if value is None:
        return SUCCEEDED, None
    try:
        text = json.dumps(to_json_object(value), allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        return SUCCEEDED, f"the handler's result ({type(value).__name__}) is not stored: {error}"
    if holds_nul(text):
        return SUCCEEDED, "the handler's result is not stored: it holds a NUL character"
    return Outcome(OutcomeKind.SUCCEEDED, result=text), None

_STOPPED = {
    StopReason.TIMEOUT: (OutcomeKind.FAILED, "JobTimeout"),
    StopReason.CANCEL_REQUESTED: (OutcomeKind.CANCELLED, "JobCancelled"),
    StopReason.LEASE_LOST: (OutcomeKind.LOST, "LeaseLost"),
    StopReason.LEASE_UNRENEWED: (OutcomeKind.LOST, "LeaseLost"),
    StopReason.SHUTDOWN: (OutcomeKind.RELEASED, "WorkerShutdown"),
}

STOP_MESSAGES = {
    StopReason.TIMEOUT: "the attempt ran longer than its timeout of {timeout:g}s and was cancelled",
    StopReason.CANCEL_REQUESTED: "cancelled on request while running",
    StopReason.LEASE_LOST: "another worker took the lease over; this attempt was stopped",
    StopReason.LEASE_UNRENEWED: "the lease could not be renewed (database unreachable); "
    "the attempt was stopped before the lease expired",
    StopReason.SHUTDOWN: "cut short at worker shutdown; due again at once",
}


def outcome_of(
    error: BaseException | None,
    stop_reason: StopReason | None = None,
    *,
    non_retryable: Collection[type[BaseException]] = (),
    timeout_seconds: float | None = None,
) -> Outcome:
    """The outcome of an attempt that raised ``error`` (None: returned normally).

    ``stop_reason`` is set when agora-pg stopped the attempt itself; it decides the
    outcome whatever the handler raised while stopping. A ``CancelledError`` with no
    stop reason is the handler's own: an ordinary failure. ``Fail`` and the types in
    ``non_retryable`` fail the job without retries.
    """
    if stop_reason is not None:
        kind, error_type = _STOPPED[stop_reason]
        text = STOP_MESSAGES[stop_reason].format(timeout=timeout_seconds or 0.0)
        return Outcome(kind, error_type, storable_text(f"{error_type}: {text}", MAX_ERROR_MESSAGE))
    if error is None:
        return SUCCEEDED
    if isinstance(error, PipelineInterrupted):  # a resumable pipeline ended early at shutdown
        return Outcome(OutcomeKind.RELEASED, "WorkerShutdown", describe_error(error)[1])
    error_type, message = describe_error(error)
    if isinstance(error, asyncio.CancelledError):
        message = storable_text(
            "CancelledError: the handler raised CancelledError itself (agora-pg did not cancel it)",
            MAX_ERROR_MESSAGE,
        )
    return Outcome(OutcomeKind.FAILED, error_type, message, format_traceback(error),
                   final=isinstance(error, (Fail, *non_retryable)), intended=isinstance(error, Fail),
                   retry_after=error.delay_seconds if isinstance(error, Retry) else None)


def thread_left_running(outcome: Outcome, thread: str, waited: float, retry_at_least: float) -> Outcome:
    """The outcome of a stopped attempt whose sync handler's ``thread`` has not returned
    ``waited`` seconds after its deadline: recorded as it was stopped, the thread left
    running; a retry waits ``retry_at_least`` seconds (until the process has exited)."""
    text = (f"{outcome.error_message}; its thread {thread} had not returned {waited:g}s later and was "
            "left running: the worker stopped so that its process is restarted")
    return dataclasses.replace(outcome, error_message=storable_text(text, MAX_ERROR_MESSAGE),
                               retry_at_least=retry_at_least)


def storable_text(text: str, limit: int) -> str:
    """``text`` as PostgreSQL can store it: NUL characters written as ``\\x00``, lone
    surrogates as ``\\udXXX``, and at most ``limit`` characters (cut with ``...``)."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    if not text.isascii():
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    return text


def describe_error(error: BaseException) -> tuple[str, str]:
    """The ``(error_type, error_message)`` pair stored for a failed attempt: the class
    name and ``"Type: text"``, both storable."""
    error_type = storable_text(type(error).__name__, 200)
    try:
        text = str(error)
    except Exception as unprintable:  # a __str__ that raises must not lose the outcome
        text = f"<unprintable {error_type}: {type(unprintable).__name__}>"
    message = f"{error_type}: {text}" if text else error_type
    return error_type, storable_text(message, MAX_ERROR_MESSAGE)


def format_traceback(error: BaseException) -> str:
    """The error's traceback as stored: the last ``MAX_TRACEBACK`` characters (the
    innermost frames and the error itself are the useful end)."""
    try:
        text = "".join(tracebacks.format_exception(error))
    except Exception:  # a broken __str__ or __cause__ chain
        text = f"{type(error).__name__} (traceback could not be formatted)"
    if len(text) > MAX_TRACEBACK:
        text = "...\n" + text[-(MAX_TRACEBACK - 4):]
    return storable_text(text, MAX_TRACEBACK)
