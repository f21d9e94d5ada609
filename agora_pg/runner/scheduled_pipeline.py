"""ScheduledPipeline: runs a pipeline factory on a Schedule, with its state in Postgres.

Nothing that matters lives in memory: the next run time, the consecutive error
counter and who is running the pipeline are columns of ``agora.schedules``.
Several processes may register the same pipeline; each due run is claimed by
exactly one of them (``FOR UPDATE SKIP LOCKED`` plus a lease), and a run's end is
recorded only by the worker that still holds the lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from agora_pg.db.connect import resolve_database
from agora_pg.db.schedule_rows import ClaimedRun, RunFinish, ScheduleRegistration, ScheduleRow
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.lifecycle import wait_for_event
from agora_pg.pipelines.pipeline import PipelineInterrupted, PipelineRun, current_run
from agora_pg.retry import describe_error
from agora_pg.schedules import Schedule, error_backoff
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.worker import ErrorWait, check_schema, new_worker_id

log = logging.getLogger("agora_pg.runner")

MAX_IDLE_WAIT = 30.0  # an idle pipeline looks at its row at least this often
LEASE_RACE_WAIT = 0.05  # another worker is claiming right now: look again shortly
# Wake this long after a run is due, so that the database clock (which decides the claim)
# has passed it too; waking a hair early would cost a failed claim and a second look.
CLOCK_MARGIN = 0.001
RELEASE_TIMEOUT = 5.0  # how long a cancelled run may take to give its lease back


class Runnable(Protocol):
    """What a factory returns: anything with an async ``run()`` (and optionally an
    async ``close()`` / ``aclose()``, called after every run)."""

    def run(self) -> Awaitable[Any]: ...


Factory = Callable[[], Awaitable[Runnable] | Runnable]
Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(UTC)


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

    def as_json(self) -> dict[str, Any]:
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
            "last_error": self.last_error,
        }


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
        *,
        clock: Clock = utc_now,
    ) -> None:
        if not isinstance(pipeline_id, str) or not pipeline_id.strip():
            raise ValueError("pipeline_id must be a non-empty string")
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
        self._clock = clock
        self._stop = asyncio.Event()
        self._wake = asyncio.Event()  # the schedule row changed (resumed, triggered) or stop()
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
        row = self._row
        return PipelineStatus(
            pipeline_id=self.pipeline_id,
            state=row.state if row else "starting",
            running=self._running,
            next_run_at=row.next_run_at if row else None,
            last_started_at=row.last_started_at if row else None,
            last_finished_at=row.last_finished_at if row else None,
            last_status=row.last_status if row else None,
            consecutive_errors=row.consecutive_errors if row else 0,
            last_error=row.last_error if row else None,
        )

    async def start(self) -> None:
        """Run until stopped, on the database of the environment (or the embedded one)."""
        settings = load_settings(os.environ)
        async with resolve_database(settings) as database:
            store = Store.open(database, pool_size=2)
            try:
                await check_schema(store)
                await self.serve(store, new_worker_id(), settings)
            finally:
                await store.close()

    async def serve(self, store: Store, worker_id: str, settings: Settings) -> None:
        """Run on an open Store as ``worker_id`` (a WorkerPool calls this)."""
        runner = _PipelineRunner(self, store, worker_id, settings)
        await runner.register()
        await runner.loop()


class _PipelineRunner:
    """One ScheduledPipeline serving in one process."""

    def __init__(self, pipeline: ScheduledPipeline, store: Store, worker_id: str, settings: Settings) -> None:
        self.pipeline = pipeline
        self.store = store
        self.worker_id = worker_id
        self.lease_seconds = settings.lease_seconds
        self.spec = pipeline.schedule.spec

    async def register(self) -> None:
        pipeline = self.pipeline
        registration = ScheduleRegistration(
            pipeline_id=pipeline.pipeline_id,
            kind=pipeline.schedule.kind.value,
            spec=self.spec,
            first_run_at=pipeline.schedule.first_run_at(pipeline._clock()),
            error_backoff_seconds=pipeline.error_backoff_seconds,
            max_consecutive_errors=pipeline.max_consecutive_errors,
        )
        pipeline._row = await self._retrying(lambda: self.store.upsert_schedule(registration))
        log.info(
            "pipeline %s registered: %s, state %s, next run %s",
            pipeline.pipeline_id, self.spec, pipeline._row.state, pipeline._row.next_run_at,
        )

    async def loop(self) -> None:
        pipeline = self.pipeline
        while not pipeline._stop.is_set():
            pipeline._wake.clear()  # before reading the row: a change from now on wakes the wait below
            claimed = await self._retrying(
                lambda: self.store.claim_pipeline_run(pipeline.pipeline_id, self.spec, self.worker_id, self.lease_seconds)
            )
            if claimed is not None:
                next_run_at = await self.run_once(claimed)
                if next_run_at is None:
                    return  # a once schedule that succeeded
                wait = (next_run_at - pipeline._clock()).total_seconds() + CLOCK_MARGIN
                await wait_for_event(pipeline._wake, min(max(wait, 0.0), MAX_IDLE_WAIT))
                continue
            row = await self._retrying(lambda: self.store.get_schedule(pipeline.pipeline_id))
            if row is None:  # deleted by hand: register again
                await self.register()
                continue
            pipeline._row = row
            if row.state == "completed" and row.schedule_spec == self.spec:
                log.info("pipeline %s has completed its once schedule; not running it again", pipeline.pipeline_id)
                return
            await wait_for_event(pipeline._wake, self._idle_wait(row))

    def _idle_wait(self, row: ScheduleRow) -> float:
        if row.state != "active" or row.schedule_spec != self.spec or row.due_in_seconds is None:
            return MAX_IDLE_WAIT
        if row.lease_owner is not None and row.lease_left_seconds is not None:
            return min(max(row.lease_left_seconds, LEASE_RACE_WAIT), MAX_IDLE_WAIT)
        if row.due_in_seconds > 0:  # not due yet by the database clock
            return min(row.due_in_seconds + CLOCK_MARGIN, MAX_IDLE_WAIT)
        return LEASE_RACE_WAIT  # due and unleased: another worker is claiming it right now

    async def run_once(self, claimed: ClaimedRun) -> datetime | None:
        """Run the claimed tick, record it, and return the next run time.
        Raises the run's error when it stops the schedule."""
        pipeline = self.pipeline
        pipeline._row = claimed.schedule
        pipeline._running = True
        renewer = asyncio.create_task(self._renew_lease())
        error: BaseException | None = None
        # The run's checkpoints and dead letters go through this store; a stop request
        # ends a resumable pipeline after its current batch.
        run_token = current_run.set(PipelineRun(self.store, claimed.run_id, pipeline._stop))
        try:
            await _run_pipeline(pipeline.factory)
        except asyncio.CancelledError:
            await self._release(claimed)
            raise
        except PipelineInterrupted as interrupted:
            log.info("%s", interrupted)
            await self._release(claimed)
            return None
        except Exception as raised:
            error = raised
        finally:
            current_run.reset(run_token)
            renewer.cancel()
            pipeline._running = False
        finish = self._finish(claimed, error)
        recorded = await self._retrying(lambda: self.store.finish_pipeline_run(finish))
        if not recorded:
            log.warning("pipeline %s: run %s was taken over by another worker; outcome not recorded",
                        pipeline.pipeline_id, claimed.run_id)
        pipeline._row = dataclasses.replace(
            claimed.schedule, state=finish.state, next_run_at=finish.next_run_at,
            consecutive_errors=finish.consecutive_errors, last_error=finish.error_message,
            last_status=finish.status, last_finished_at=pipeline._clock(), lease_owner=None,
        )
        if error is not None:
            log.error("pipeline %s run failed (%d in a row): %s", pipeline.pipeline_id,
                      finish.consecutive_errors, finish.error_message)
            if finish.state == "stopped":
                raise error
        return finish.next_run_at

    def _finish(self, claimed: ClaimedRun, error: BaseException | None) -> RunFinish:
        pipeline = self.pipeline
        finished_at = pipeline._clock()
        error_type = message = None
        if error is None:
            status, errors = "succeeded", 0
            next_run_at = pipeline.schedule.next_run_after_success(finished_at)
            state = "completed" if next_run_at is None else "active"
        else:
            status, errors = "failed", claimed.schedule.consecutive_errors + 1
            error_type, message = describe_error(error)
            next_run_at = finished_at + timedelta(seconds=error_backoff(errors, pipeline.error_backoff_seconds))
            state = "stopped" if errors >= pipeline.max_consecutive_errors else "active"
        return RunFinish(
            pipeline_id=pipeline.pipeline_id, worker_id=self.worker_id, run_id=claimed.run_id, status=status,
            error_type=error_type, error_message=message, consecutive_errors=errors,
            next_run_at=next_run_at, state=state,
        )

    async def _release(self, claimed: ClaimedRun) -> None:
        """Record the cancelled run and free the lease; bounded, since the process is stopping
        (if the database does not answer in time, the lease simply expires)."""
        with contextlib.suppress(DatabaseUnavailable, TimeoutError):
            await asyncio.wait_for(
                self.store.release_pipeline_run(self.pipeline.pipeline_id, self.worker_id, claimed.run_id),
                RELEASE_TIMEOUT,
            )
            log.warning("pipeline %s: run cancelled at shutdown and released", self.pipeline.pipeline_id)

    async def _renew_lease(self) -> None:
        while True:
            await asyncio.sleep(self.lease_seconds / 3)
            try:
                await self.store.renew_pipeline_lease(self.pipeline.pipeline_id, self.worker_id, self.lease_seconds)
            except DatabaseUnavailable as error:
                log.warning("pipeline %s: renewing the lease failed: %s", self.pipeline.pipeline_id, error)

    async def _retrying(self, call: Callable[[], Awaitable[Any]]) -> Any:
        """Call until the database answers (a stop request ends the waiting)."""
        error_wait = ErrorWait(0.5)
        while True:
            try:
                return await call()
            except DatabaseUnavailable as error:
                wait = error_wait.next()
                log.warning("pipeline %s: %s; retrying in %.1fs", self.pipeline.pipeline_id, error, wait)
                await asyncio.sleep(wait)


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
