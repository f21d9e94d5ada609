"""One attempt of a job as this worker runs it: the handler under its timeout, stopped
for a reason (timeout, cancel request, lost lease, shutdown), and every way out
turned into one ``Outcome``."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import inspect
import logging
import threading
from typing import Any

from agora_pg.errors import Fail, InvalidJob
from agora_pg.jobs import Job
from agora_pg.logs import Repeated
from agora_pg.payloads import decode
from agora_pg.outcomes import SUCCEEDED, Outcome, StopReason, outcome_of, succeeded_with
from agora_pg.runtime.leases import LeaseToken
from agora_pg.worker.context import ProgressReporter, current_attempt
from agora_pg.worker.handlers import Handler, KindOptions, UnknownJobKind, handler_name

log = logging.getLogger("agora_pg.worker")


DEFAULT_OPTIONS = KindOptions()
# "stopping it" lines, one per reason: at shutdown or in an outage they come for every job at once
STOPPING = {reason: Repeated(log, logging.INFO) for reason in StopReason}


@dataclasses.dataclass(eq=False, slots=True)
class Attempt:
    """A claimed attempt (a ``LeaseHolder``): the job as claimed, its lease token, the
    task running it, when it times out (a ``time.monotonic()`` value) and why agora-pg
    stopped it (None while it runs on its own)."""

    job: Job
    handler: Handler | None
    is_async: bool
    options: KindOptions
    timeout: float | None
    deadline: float | None = None
    task: asyncio.Task[Outcome | None] | None = None
    stop_reason: StopReason | None = None
    thread_result: asyncio.Future[Any] | None = None  # a sync handler's, settled when its thread returns
    shutting_down: bool = False
    fence_at: float = 0.0  # the lease supervisor's bookkeeping (LeaseHolder)
    stopped_for: tuple[StopReason, ...] = ()
    outcome: Outcome | None = None  # how it ended, once it has
    reporter: ProgressReporter | None = None  # where ``job_context().progress()`` goes
    claimed_at: float = 0.0  # time.monotonic() of the claim, and of the outcome (for /metrics)
    ended_at: float = 0.0
    given_up: bool = False  # a sync handler's thread past its ceiling: recorded as stopped, left running

    @property
    def token(self) -> LeaseToken:
        return LeaseToken(self.job.id, self.job.attempt)

    @property
    def description(self) -> str:
        handler = handler_name(self.handler) if self.handler is not None else "no handler"
        return f"job {self.job.id} (kind {self.job.kind!r}, handler {handler})"

    @property
    def thread_name(self) -> str:
        """The name of a sync handler's thread."""
        return f"agora-job-{self.job.id}"

    @property
    def in_thread(self) -> bool:
        """A sync handler whose thread is still running (it cannot be interrupted)."""
        return self.thread_result is not None and not self.thread_result.done()

    def stop(self, reason: StopReason) -> None:
        """Stop the attempt (the first reason given is the one recorded)."""
        if self.task is None or self.task.done():
            return
        if reason is StopReason.SHUTDOWN:
            self.shutting_down = True
        if self.stop_reason is None:
            self.stop_reason = reason
            STOPPING[reason].log("%s: stopping it (%s)", self.description, reason.value)
        elif reason is not StopReason.SHUTDOWN:
            return  # already stopping; only shutdown may still end a wait for a thread
        self.task.cancel()


async def run_attempt(attempt: Attempt, resources: Any) -> Outcome | None:
    """Run the attempt's handler and return how it ended; never raises (a cancel that
    stops it is part of the outcome; the worker stops it at its ``deadline``). A sync handler stopped for any reason other than
    shutdown holds the attempt (its slot and its lease) until its thread returns or the
    worker gives the thread up (``given_up``: the outcome is then recorded). None:
    a sync handler still running at shutdown, left as it is (nothing may be recorded
    while it runs: its lease expires once the process has exited)."""
    current_attempt.set(attempt)  # (the attempt's own task: nothing to reset)
    try:
        job = attempt.job if attempt.options.payload is None else typed_job(attempt.job, attempt.options.payload)
        if attempt.is_async:  # (the common case first, and without a frame of its own)
            result = await attempt.handler(job, resources)  # type: ignore[misc]
        else:
            result = await _call_handler(attempt, job, resources)
        error: BaseException | None = None
    except BaseException as raised:  # every way out is an outcome, CancelledError included
        if isinstance(raised, KeyboardInterrupt | SystemExit):
            raise
        error = raised
    if error is None and attempt.stop_reason is None:
        if result is None:
            return SUCCEEDED
        outcome, problem = succeeded_with(result)
        if problem is not None:
            log.warning("%s: %s", attempt.description, problem)
        return outcome
    if attempt.in_thread and not attempt.given_up:
        return None
    return outcome_of(
        error, attempt.stop_reason, non_retryable=attempt.options.non_retryable, timeout_seconds=attempt.timeout
    )


def typed_job(job: Job, payload_type: type) -> Job:
    """The job as the handler of a typed kind sees it: ``payload`` decoded into
    ``payload_type``. A payload that does not decode (a job inserted by SQL, or enqueued
    before the type changed) fails the job at once: no retry can mend it."""
    try:
        decoded = decode(job.payload, payload_type)
    except InvalidJob as error:
        raise Fail(f"the payload does not decode: {error}") from None
    return Job.from_fields({**job.__dict__, "payload": decoded})


async def _call_handler(attempt: Attempt, job: Job, resources: Any) -> Any:
    """A sync handler in a thread of its own (or the error of a kind with no handler);
    returns what the handler returned."""
    if attempt.handler is None:
        raise UnknownJobKind(attempt.job.kind)
    result = await _in_thread(attempt, job, resources)
    if inspect.isawaitable(result):  # a sync function that returned a coroutine
        return await result
    return result


async def _in_thread(attempt: Attempt, job: Job, resources: Any) -> Any:
    """Run a sync handler in a daemon thread of its own (so that a hung one never keeps
    the process from exiting) and wait for it. Python cannot interrupt a thread: a stop
    other than shutdown keeps waiting for it, holding the slot and the lease, so that the
    job never runs twice, until the worker gives the thread up (its attempt's deadline plus
    a lease: ``Attempt.given_up``); at shutdown the worker leaves it running, unreleased."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Any] = loop.create_future()
    attempt.thread_result = done
    context = contextvars.copy_context()
    assert attempt.handler is not None
    handler = attempt.handler

    def settle(result: Any, error: BaseException | None) -> None:
        if done.done():
            return
        if error is not None:
            done.set_exception(error)
        else:
            done.set_result(result)

    def target() -> None:
        result: Any = None
        failure: BaseException | None = None
        try:
            result = context.run(handler, job, resources)
        except BaseException as error:  # handed to the event loop as the attempt's error
            failure = error
        with contextlib.suppress(RuntimeError):  # (the loop closed: a thread given up returned late)
            loop.call_soon_threadsafe(settle, result, failure)

    threading.Thread(target=target, name=attempt.thread_name, daemon=True).start()
    warned = False
    while True:
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            if done.done() or attempt.stop_reason is None or attempt.shutting_down or attempt.given_up:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            if not warned:
                warned = True
                log.warning(
                    "%s: %s, but a sync handler cannot be interrupted: waiting for its thread "
                    "(the job stays held, so it does not run twice)",
                    attempt.description, attempt.stop_reason.value,
                )
