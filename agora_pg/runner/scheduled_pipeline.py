"""ScheduledPipeline: runs a pipeline factory on a Schedule, with its state in Postgres.

Nothing that matters lives in memory: the next run time, the consecutive error
counter and who is running the pipeline are columns of ``agora.schedules``.
Several processes may register the same pipeline; each due run is claimed by
exactly one of them (``FOR UPDATE SKIP LOCKED`` plus a lease), and a run's end is
recorded only by the worker that still holds the lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol, TypeVar

from agora_pg.db.connect import resolve_database
from agora_pg.db.schedule_rows import ClaimedRun, RunFinish, ScheduleRegistration, ScheduleRow
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, DatabaseUnavailable
from agora_pg.lifecycle import WakeSignal
from agora_pg.outcomes import Outcome, OutcomeKind, StopReason, outcome_of
from agora_pg.pipelines.pipeline import PipelineInterrupted, PipelineRun, current_run
from agora_pg.runner.database_clock import DatabaseClock
from agora_pg.runner.run_batches import RunBatches
from agora_pg.runtime.database_calls import StopSignal, retry_database
from agora_pg.runtime.leases import LeaseSupervisor, LeaseToken, supervising
from agora_pg.runtime.process import ErrorWait, check_schema, new_worker_id, warn_unknown_settings
from agora_pg.runtime.process_metrics import PROCESS_METRICS
from agora_pg.schedules import NextRun, Schedule, ScheduleKind, error_backoff
from agora_pg.settings import Settings, load_settings

log = logging.getLogger("agora_pg.runner")

MAX_IDLE_WAIT = 30.0  # an idle pipeline looks at its row at least this often
LEASE_RACE_WAIT = 0.05  # another worker is claiming right now: look again shortly
# Wake this long after a run is due, so that the database clock (which decides the claim)
# has passed it too; waking early costs a failed claim and a second look. The estimate
# of the database clock puts it a little ahead (database_clock.py); this covers that.
CLOCK_MARGIN = 0.005
# A pipeline whose next run is due at a known moment wakes this much earlier and asks for
# its claim to be sent at that moment: the claims of all the pipelines due then go out in
# one statement, on time, however long their wake-ups took the event loop (a thousand
# take about 20 ms; 2,000 in each of 3 processes on 2 cores took over 100 ms).
EARLY_WAKE = 0.3
RELEASE_TIMEOUT = 5.0  # how long a cancelled run may take to give its lease back


class Runnable(Protocol):
    """What a factory returns: anything with an async ``run()`` (and optionally an
    async ``close()`` / ``aclose()``, called after every run)."""

    def run(self) -> Awaitable[Any]: ...


Factory = Callable[[], Awaitable[Runnable] | Runnable]
T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class PipelineStatus:
    """What the health server reports about one pipeline."""

    pipeline_id: str
    state: str
    running: bool
    next_run_at: datetime | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_status: str | None
    consecutive_errors: int
    last_error: str | None

    @classmethod
    def of(cls, pipeline_id: str, row: ScheduleRow | None, running: bool = False) -> PipelineStatus:
        """The status a schedule row says (None: not read yet)."""
        return cls(
            pipeline_id=pipeline_id,
            state=row.state if row else "starting",
            running=running,
            next_run_at=row.next_run_at if row else None,
            last_started_at=row.last_started_at if row else None,
            last_finished_at=row.last_finished_at if row else None,
            last_status=row.last_status if row else None,
            consecutive_errors=row.consecutive_errors if row else 0,
            last_error=row.last_error if row else None,
        )

    def as_json(self, *, error_details: bool = False) -> dict[str, Any]:
        """The report; the last error's raw text only with ``error_details`` (it may hold
        anything the error said), otherwise its type."""

        def iso(value: datetime | None) -> str | None:
            return value.isoformat() if value else None

        return {
            "state": self.state,
            "running": self.running,
            "next_run_at": iso(self.next_run_at),
            "last_started_at": iso(self.last_started_at),
            "last_finished_at": iso(self.last_finished_at),
            "last_status": self.last_status,
            "consecutive_errors": self.consecutive_errors,
            "last_error_type": error_type(self.last_error),
            **({"last_error": self.last_error} if error_details else {}),
        }


_ERROR_TYPE = re.compile(r"[A-Za-z_][\w.]*(?=:|$)")


def error_type(error_text: str | None) -> str | None:
    """The exception type an error text starts with (``ValueError: ...`` -> ``ValueError``)."""
    if not error_text:
        return None
    match = _ERROR_TYPE.match(error_text.strip())
    return match.group(0) if match else "error"


class ScheduledPipeline:
    """Runs ``await factory()`` then ``await pipeline.run()`` on ``schedule``.

    A raise from the factory, the run or the close is a failed run: the next
    attempt waits ``error_backoff_seconds * 2**(n-1)`` (at most 10 minutes) after
    the n-th failure in a row; after ``max_consecutive_errors`` failures in a row
    the schedule stops and ``start()`` raises the last error. A success resets
    the counter.
    """

    def __init__(
        self,
        factory: Factory,
        schedule: Schedule,
        pipeline_id: str,
        error_backoff_seconds: float = 60.0,
        max_consecutive_errors: int = 10,
    ) -> None:
        if not isinstance(pipeline_id, str) or not pipeline_id.strip():
            raise ValueError("pipeline_id must be a non-empty string")
        if inspect.isawaitable(factory):  # factory=build_pipeline() instead of factory=build_pipeline
            name = getattr(factory, "__name__", "build_pipeline")
            if inspect.iscoroutine(factory):
                factory.close()  # (it will never be awaited: no warning about it)
            raise TypeError(f"factory must be the function itself, not a call of it: write "
                            f"factory={name}, not factory={name}()")
        if not callable(factory):
            raise TypeError(f"factory must be a function that returns the pipeline, got {type(factory).__name__}")
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a Schedule (Schedule.every(...), ...), got {type(schedule).__name__}")
        if error_backoff_seconds < 0:
            raise ValueError("error_backoff_seconds must be >= 0")
        if max_consecutive_errors < 1:
            raise ValueError("max_consecutive_errors must be >= 1")
        self.factory = factory
        self.schedule = schedule
        self.pipeline_id = pipeline_id
        self.error_backoff_seconds = float(error_backoff_seconds)
        self.max_consecutive_errors = max_consecutive_errors
        self._stop = StopSignal()
        self._wake = WakeSignal()  # the schedule row changed (resumed, triggered) or stop()
        self._running = False
        self._row: ScheduleRow | None = None

    def stop(self) -> None:
        """Stop after the current run (a sleeping pipeline stops at once)."""
        self._stop.set()
        self._wake.set()

    def wake(self) -> None:
        """Look at the schedule row now instead of at the end of the current wait."""
        self._wake.set()

    @property
    def status(self) -> PipelineStatus:
        return PipelineStatus.of(self.pipeline_id, self._row, self._running)

    async def start(self) -> None:
        """Run until stopped, on the database of the environment (or the embedded one)."""
        warn_unknown_settings()
        settings = load_settings(os.environ)
        async with resolve_database(settings) as database:
            store = Store.open(database, pool_size=2, timeout=settings.database_timeout)
            try:
                await check_schema(store)
                await self.serve(store, new_worker_id(), settings)
            finally:
                await store.close()

    async def serve(
        self, store: Store, worker_id: str, settings: Settings, supervisor: LeaseSupervisor | None = None,
        batches: RunBatches | None = None,
    ) -> None:
        """Run on an open Store as ``worker_id`` (a WorkerPool calls this, with its lease
        supervisor and the run statements its pipelines share; without them, the pipeline
        runs its own)."""
        batches = batches or RunBatches(store, worker_id, settings.lease_seconds)
        async with supervising(supervisor, store.database, worker_id, settings) as leases:
            runner = _PipelineRunner(self, store, worker_id, leases, batches)
            if await runner.register():
                await runner.loop()


class RunAbandoned(AgoraError):
    """A run's worker was lost (its lease expired) often enough in a row to stop the schedule."""


class ScheduleStopped(AgoraError):
    """A pipeline started on a schedule that ``max_consecutive_errors`` stopped earlier: it
    does not run until resumed."""

    def __init__(self, pipeline_id: str, consecutive_errors: int, last_error: str | None) -> None:
        last = (last_error or "unknown").splitlines()[0] if (last_error or "").strip() else "unknown"
        super().__init__(
            f"pipeline {pipeline_id}: its schedule is stopped after {consecutive_errors} failed runs in a row "
            f"(last error: {last}); resume it with `agora-pg schedules resume {pipeline_id}` or "
            f"POST /schedules/{pipeline_id}/resume, then start again"
        )
        self.pipeline_id = pipeline_id
        self.consecutive_errors = consecutive_errors
        self.last_error = last_error


class _PipelineRunner:
    """One ScheduledPipeline serving in one process."""

    def __init__(
        self, pipeline: ScheduledPipeline, store: Store, worker_id: str, supervisor: LeaseSupervisor,
        batches: RunBatches,
    ) -> None:
        self.pipeline = pipeline
        self.store = store
        self.batches = batches
        self.worker_id = worker_id
        self.supervisor = supervisor
        self.spec = pipeline.schedule.spec
        self.what = f"pipeline {pipeline.pipeline_id}"
        self._due_at = 0.0  # time.monotonic() when the run waited for is due (0: claim at once)

    async def _call(self, call: Callable[[], Awaitable[T]], what: str, stop: asyncio.Event | None = None) -> T:
        """A database call, retried while the database is unavailable, until the pipeline stops."""
        return await retry_database(call, what=f"{self.what}: {what}", stop=stop or self.pipeline._stop, first_wait=0.5)

    async def register(self) -> bool:
        """Register the schedule; False if the pipeline was stopped before the database answered."""
        pipeline = self.pipeline
        try:
            # a cron schedule's first tick is the next after the database's clock, not this host's
            first_run_at = (pipeline.schedule.first_run_at(await self._call(self.store.database_now,
                                                                            "reading the database clock"))
                            if pipeline.schedule.kind is ScheduleKind.CRON else None)
        except DatabaseUnavailable:
            return False
        registration = ScheduleRegistration(
            pipeline_id=pipeline.pipeline_id,
            kind=pipeline.schedule.kind.value,
            spec=self.spec,
            first_run_at=first_run_at,
            error_backoff_seconds=pipeline.error_backoff_seconds,
            max_consecutive_errors=pipeline.max_consecutive_errors,
            new_launch=pipeline.schedule.once_per_launch,
        )
        try:
            pipeline._row = await self._call(lambda: self.store.schedules.upsert(registration), "registering")
        except DatabaseUnavailable:
            return False
        log.info(
            "pipeline %s registered: %s, state %s, next run %s",
            pipeline.pipeline_id, self.spec, pipeline._row.state, pipeline._row.next_run_at,
        )
        return True

    async def loop(self) -> None:
        pipeline = self.pipeline
        pause = ErrorWait(0.5)
        while not pipeline._stop.is_set():
            pipeline._wake.clear()  # before reading the row: a change from now on wakes the wait below
            try:
                wait = await self._step()
                pause.reset()
            except DatabaseUnavailable:
                return  # stopped while the database was away
            except _ScheduleStopped as stopped:
                raise stopped.error from None
            except Exception:  # the loop never ends on agora-pg's own errors: it waits and looks again
                wait = pause.next()
                log.exception("%s: looking at its schedule failed; again in %.1fs", self.what, wait)
            if wait is None:
                return
            if await pipeline._wake.wait(min(max(wait, 0.0), MAX_IDLE_WAIT)):
                self._due_at = 0.0  # woken by a trigger, a resume or a stop: look at once

    async def _step(self) -> float | None:
        """Claim and run the due run, or look at the schedule; returns how long to wait
        before the next look (None: this pipeline is done)."""
        pipeline = self.pipeline
        claimed_at = time.monotonic()
        due_at, self._due_at = self._due_at, 0.0
        not_before = due_at if due_at - claimed_at < 2 * EARLY_WAKE else 0.0
        claimed = await self._call(
            lambda: self.batches.claim(pipeline.pipeline_id, self.spec, not_before),
            "claiming its run",
        )
        self.batches.pipeline_ready(pipeline.pipeline_id)
        if claimed is not None:
            clock = self.batches.clock  # (read by this claim)
            next_run = await self.run_once(claimed, claimed_at, clock)
            if next_run is None:
                return None  # a once schedule that succeeded
            return self._until_due((next_run - clock.now()).total_seconds() + CLOCK_MARGIN)
        await self._call(self.batches.read_clock, "reading the database clock")
        row = await self._call(lambda: self.batches.read_schedule(pipeline.pipeline_id), "reading its schedule")
        if row is None:  # deleted by hand: register again
            return 0.0 if await self.register() else None
        if row.lease_owner not in (None, self.worker_id) and (row.lease_left_seconds or 0.0) < 0:
            if await self._rescue() is not None:
                return 0.0  # look again at once: due after the error backoff
        pipeline._row = row
        if row.schedule_spec == self.spec and row.state == "stopped":
            raise _ScheduleStopped(ScheduleStopped(pipeline.pipeline_id, row.consecutive_errors, row.last_error))
        if row.state == "completed" and row.schedule_spec == self.spec:
            if pipeline.schedule.once_per_launch:  # another launch ran it meanwhile: this one runs it too
                again = await self._call(lambda: self.store.schedules.launch_once_again(pipeline.pipeline_id, self.spec),
                                         "launching its once schedule again")
                pipeline._row = again or row
                return 0.0
            log.info("pipeline %s has completed its once schedule (%s); not running it again",
                     pipeline.pipeline_id, self.spec)
            return None
        return self._idle_wait(row)

    async def _rescue(self) -> ScheduleRow | None:
        """Take the run over from a worker whose lease expired: counted as a failed run."""
        pipeline = self.pipeline
        row = await self._call(lambda: self.store.schedules.rescue_run(pipeline.pipeline_id), "taking over its run")
        if row is None:
            return None
        pipeline._row = row
        log.error("pipeline %s: %s; counted as a failed run (%d in a row)", pipeline.pipeline_id, row.last_error,
                  row.consecutive_errors)
        if row.state == "stopped":
            raise _ScheduleStopped(RunAbandoned(f"{row.last_error} ({row.consecutive_errors} failed runs in a row)"))
        return row

    def _idle_wait(self, row: ScheduleRow) -> float:
        if row.state != "active" or row.schedule_spec != self.spec or row.due_in_seconds is None:
            return MAX_IDLE_WAIT
        if row.lease_owner is not None and row.lease_left_seconds is not None:
            return min(max(row.lease_left_seconds, LEASE_RACE_WAIT), MAX_IDLE_WAIT)
        if row.due_in_seconds > 0:  # not due yet by the database clock
            # By the process's clock when it has been read (the pipelines due at one moment
            # then wake together); due_in_seconds was late by the time its reply took.
            due_in = row.due_in_seconds
            if self.batches.clock.read and row.next_run_at is not None:
                estimate = (row.next_run_at - self.batches.clock.now()).total_seconds()
                due_in = estimate if estimate > 0 else due_in
            return self._until_due(due_in + CLOCK_MARGIN) if due_in + CLOCK_MARGIN < MAX_IDLE_WAIT else MAX_IDLE_WAIT
        return LEASE_RACE_WAIT  # due and unleased: another worker is claiming it right now

    def _until_due(self, seconds: float) -> float:
        """The wait before a run due in ``seconds``: until ``EARLY_WAKE`` before it (the
        claim then waits in the batch for the moment itself)."""
        self._due_at = time.monotonic() + seconds
        return max(seconds - EARLY_WAKE, 0.0)

    async def run_once(self, claimed: ClaimedRun, claimed_at: float, clock: DatabaseClock) -> datetime | None:
        """Run the claimed tick under its lease, record it, and return the next run time.
        Raises the run's error when it stops the schedule."""
        pipeline = self.pipeline
        pipeline._row = claimed.schedule
        PROCESS_METRICS.schedule_started(pipeline.pipeline_id,
                                         (claimed.database_now - claimed.scheduled_for).total_seconds())
        pipeline._running = True
        token = LeaseToken("run", pipeline.pipeline_id, claimed.run_id)
        # The run's checkpoints and dead letters go through this store; a stop request
        # ends a resumable pipeline after its current batch.
        run_token = current_run.set(PipelineRun(self.store, claimed.run_id, pipeline._stop))
        try:
            execution = asyncio.create_task(_run_pipeline(pipeline.factory), name=f"pipeline-{pipeline.pipeline_id}")
        finally:
            current_run.reset(run_token)

        holder = _RunHolder(token, execution, f"pipeline {pipeline.pipeline_id} (run {claimed.run_id})")
        self.supervisor.hold([holder], claimed_at)
        try:
            error = await _outcome_error(execution)
        except asyncio.CancelledError:  # the pool force-cancels at the end of its grace period
            execution.cancel()
            await asyncio.wait([execution], timeout=RELEASE_TIMEOUT)
            await self._release(claimed)
            self.supervisor.release([holder])
            raise
        finally:
            pipeline._running = False
        if isinstance(error, PipelineInterrupted):
            log.info("%s", error)
            await self._release(claimed)
            self.supervisor.release([holder])
            return None
        outcome = outcome_of(error, holder.stop_reason)
        finish = self._finish(claimed, outcome, clock)
        try:
            recorded = await self._call(lambda: self.batches.finish(finish), "recording its run",
                                        stop=holder.lease_lost)
        except DatabaseUnavailable:
            recorded = False
        except Exception:
            log.exception("%s: recording run %s failed; its lease will expire", self.what, claimed.run_id)
            recorded = False
        finally:
            self.supervisor.release([holder])
        if not recorded:
            log.warning("pipeline %s: run %s was taken over by another worker; outcome not recorded",
                        pipeline.pipeline_id, claimed.run_id)
        pipeline._row = dataclasses.replace(
            claimed.schedule, state=finish.state, next_run_at=finish.next_run_at or NextRun(
                in_seconds=finish.next_run_in_seconds).at_time(clock.now()),
            consecutive_errors=finish.consecutive_errors, last_error=finish.error_message,
            last_status=finish.status, last_finished_at=clock.now(), lease_owner=None,
        )
        if outcome.kind is not OutcomeKind.SUCCEEDED:
            log.error("pipeline %s run failed (%d in a row): %s", pipeline.pipeline_id,
                      finish.consecutive_errors, finish.error_message)
            if outcome.traceback:
                log.warning("pipeline %s run %s:\n%s", pipeline.pipeline_id, claimed.run_id, outcome.traceback)
            if finish.state == "stopped":
                last = error if isinstance(error, Exception) else RunAbandoned(finish.error_message or "run failed")
                raise _ScheduleStopped(last)
        return pipeline._row.next_run_at

    def _finish(self, claimed: ClaimedRun, outcome: Outcome, clock: DatabaseClock) -> RunFinish:
        pipeline = self.pipeline
        if outcome.kind is OutcomeKind.SUCCEEDED:
            errors = 0
            next_run = pipeline.schedule.next_run_after_success(clock.now(), claimed.scheduled_for)
            state = "completed" if next_run.at is None and next_run.in_seconds is None else "active"
        else:
            errors = claimed.schedule.consecutive_errors + 1
            next_run = NextRun(in_seconds=error_backoff(errors, pipeline.error_backoff_seconds))
            state = "stopped" if errors >= pipeline.max_consecutive_errors else "active"
        return RunFinish(
            pipeline_id=pipeline.pipeline_id, worker_id=self.worker_id, run_id=claimed.run_id,
            status=outcome.run_status, error_type=outcome.error_type, error_message=outcome.error_message,
            consecutive_errors=errors, next_run_at=next_run.at, state=state,
            next_run_in_seconds=next_run.in_seconds, traceback=outcome.traceback,
        )

    async def _release(self, claimed: ClaimedRun) -> None:
        """Record the cancelled run and free the lease; bounded, since the process is stopping
        (if the database does not answer in time, the lease simply expires)."""
        try:
            await asyncio.wait_for(
                self.store.schedules.release_run(self.pipeline.pipeline_id, self.worker_id, claimed.run_id),
                RELEASE_TIMEOUT,
            )
            log.warning("pipeline %s: run cancelled at shutdown and released", self.pipeline.pipeline_id)
        except (DatabaseUnavailable, TimeoutError) as error:
            log.warning("pipeline %s: releasing the run at shutdown: %s", self.pipeline.pipeline_id,
                        error or "no answer in time")
        except Exception:
            log.exception("pipeline %s: releasing the run at shutdown failed", self.pipeline.pipeline_id)


class _RunHolder:
    """A pipeline run as the lease supervisor sees it (a ``LeaseHolder``)."""

    def __init__(self, token: LeaseToken, task: asyncio.Task[None], description: str) -> None:
        self.token = token
        self.task = task
        self.description = description
        self.stop_reason: StopReason | None = None  # the first reason it was stopped for
        self.lease_lost = asyncio.Event()  # another worker holds it: stop trying to record it
        self.fence_at = 0.0  # the lease supervisor's bookkeeping (LeaseHolder)
        self.stopped_for: tuple[StopReason, ...] = ()

    def stop(self, reason: StopReason) -> None:
        self.stop_reason = self.stop_reason or reason
        if reason is StopReason.LEASE_LOST:
            self.lease_lost.set()
        self.task.cancel()


class _ScheduleStopped(Exception):
    """The schedule stopped after ``max_consecutive_errors``; ``error`` is the last one."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


async def _outcome_error(execution: asyncio.Task[None]) -> BaseException | None:
    """Wait for the run; what it raised (its own CancelledError included), or None."""
    try:
        await asyncio.shield(execution)
    except asyncio.CancelledError:
        if not execution.done():
            raise  # the waiter itself was cancelled
        return asyncio.CancelledError() if execution.cancelled() else execution.exception()
    except BaseException as error:
        if isinstance(error, KeyboardInterrupt | SystemExit):
            raise
        return error
    return None


async def _run_pipeline(factory: Factory) -> None:
    """``factory()`` (awaited if needed), then ``run()``, then ``close()``/``aclose()``."""
    made = factory()
    pipeline = await made if inspect.isawaitable(made) else made
    try:
        await pipeline.run()
    finally:
        close = getattr(pipeline, "aclose", None) or getattr(pipeline, "close", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result
