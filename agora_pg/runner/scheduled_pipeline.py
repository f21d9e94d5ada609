"""PipelineSchedule: a pipeline factory run on a Schedule, with its state in Postgres
(``worker_pool.ScheduledPipeline`` is the public class: this, and ``start()``).

Each run is a job: the process's scheduler turns a due tick into a job of the queue
``agora:pipelines`` (kind: the pipeline id), and the pool's pipeline worker claims it,
holds its lease, and runs ``factory()`` then ``run()`` as its handler, like any job's.
At most one job per pipeline is alive (its dedup key), so runs never overlap. The
job's end updates the schedule row in the same statement (errors in a row, backoff,
stop after ``max_consecutive_errors``, the next run), from the row as it is then.
Nothing that matters lives in memory.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from typing import Any, Protocol

from agora_pg.db import queries
from agora_pg.db.pipeline_state import PipelineState
from agora_pg.db.schedule_rows import DueTick, ScheduleRow, TickJob
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job
from agora_pg.pipelines.pipeline import PipelineRun, current_run
from agora_pg.runtime.database_calls import StopSignal
from agora_pg.runtime.process_metrics import PROCESS_METRICS
from agora_pg.schedules import TICK_FIELD, Schedule, Scheduled

REPLAY_FIELD = "replay"  # the payload key of a replay's limit: it replays dead letters instead of running


class Runnable(Protocol):
    """What a factory returns: anything with an async ``run()`` (and optionally an
    async ``close()`` / ``aclose()``, called after every run)."""

    def run(self) -> Awaitable[Any]: ...


Factory = Callable[[], Awaitable[Runnable] | Runnable]


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
    def of(cls, pipeline_id: str, row: ScheduleRow | None, running: bool = False,
           deleted: bool = False) -> PipelineStatus:
        """The status a schedule row says (None: not read yet, or ``deleted``)."""
        state = "deleted" if deleted else row.state if row else "starting"
        if row is None:
            return cls(pipeline_id, state, running, None, None, None, None, 0, None)
        return cls(pipeline_id, state, running, row.next_run_at, row.last_started_at, row.last_finished_at,
                   row.last_status, row.consecutive_errors, row.last_error)

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


class PipelineSchedule(Scheduled):
    """A scheduled pipeline as a ``WorkerPool`` runs it (what it does: the public
    ``ScheduledPipeline`` of ``worker_pool``, which adds ``start()``)."""

    def __init__(
        self,
        factory: Factory,
        schedule: Schedule,
        pipeline_id: str,
        error_backoff_seconds: float = 60.0,
        max_consecutive_errors: int = 10,
    ) -> None:
        super().__init__(schedule, pipeline_id, error_backoff_seconds, max_consecutive_errors)
        if inspect.isawaitable(factory):  # factory=build_pipeline() instead of factory=build_pipeline
            name = getattr(factory, "__name__", "build_pipeline")
            if inspect.iscoroutine(factory):
                factory.close()  # (it will never be awaited: no warning about it)
            raise TypeError(f"factory must be the function itself, not a call of it: write "
                            f"factory={name}, not factory={name}()")
        if not callable(factory):
            raise TypeError(f"factory must be a function that returns the pipeline, got {type(factory).__name__}")
        JobSpec(pipeline_id, queue=queries.PIPELINE_QUEUE)  # its runs are jobs of this kind: checked now
        self.factory = factory
        self.stopping = StopSignal()  # set by stop(): a resumable pipeline ends after its current batch
        self.running = False
        # a once-per-launch schedule: this launch (set when its scheduler registers it),
        # which its runs' jobs name; a run of another launch, whichever process ran it,
        # does not count for this one
        self.launch: str | None = None
        self.succeeded_here = False  # a run of this launch succeeded (a once-per-launch schedule is done)
        self.last_error: BaseException | None = None  # what this launch's last failed run raised
        self.row: ScheduleRow | None = None  # the schedule row as last read
        self.deleted = False  # its row was deleted while this process ran it (no tick runs here any more)
        self.stopped_at_launch = False  # its schedule was stopped when registered (ScheduleStopped)
        self._stop_pool: Callable[[], None] | None = None  # the pool's stop(), once registered in one

    def stop(self) -> None:
        """Stop after the current run (a resumable pipeline after its current batch), with
        the ``WorkerPool`` that runs it."""
        self.stopping.set()
        if self._stop_pool is not None:
            self._stop_pool()

    @property
    def status(self) -> PipelineStatus:
        return PipelineStatus.of(self.pipeline_id, self.row, self.running, self.deleted)

    def plan(self, due: DueTick) -> TickJob:
        """The job that runs a due tick, and its run plan: the spec it was planned under
        and the next run after a success, which its end writes to the schedule (its
        payload has the tick and the launch, for the handler)."""
        payload: dict[str, Any] = {TICK_FIELD: due.tick.isoformat()}
        plan: dict[str, Any] = {"spec": self.schedule.spec}
        if self.launch is not None:
            payload["launch"] = plan["launch"] = self.launch
        next_run = self.schedule.next_run_after_success(due.database_now, due.tick)
        if next_run.at is not None:
            plan["next_at"] = next_run.at.isoformat()
        elif next_run.in_seconds is not None:
            plan["next_in_seconds"] = next_run.in_seconds
        job = JobSpec(self.pipeline_id, payload, queue=queries.PIPELINE_QUEUE, max_retries=0,
                      dedup_key=queries.PIPELINE_DEDUP_PREFIX + self.pipeline_id, run_at=due.tick)
        return TickJob(self.pipeline_id, due.tick, job, None, plan)

    async def run_job(self, job: Job, store: Store) -> dict[str, int] | None:
        """The handler of this pipeline's jobs: ``factory()``, ``run()``, ``close()``,
        with the run's checkpoints, dead letters and progress written through ``store``
        (or a replay of its dead letters: ``run_pipeline_job``)."""
        tick = job.payload.get(TICK_FIELD)
        if tick and job.started_at is not None:
            PROCESS_METRICS.schedule_started(
                self.pipeline_id, (job.started_at - datetime.fromisoformat(tick)).total_seconds())
        self.running = True
        try:
            result = await run_pipeline_job(self.factory, job, store, self.stopping)
        except Exception as error:
            self.last_error = error
            raise
        finally:
            self.running = False
        if job.payload.get("launch") == self.launch:
            self.succeeded_here = True
        return result


def pipeline_run_job(pipeline_id: str, when: datetime, **payload: Any) -> JobSpec:
    """The job of a run of ``pipeline_id`` outside its schedule (``agora-pg run``), due
    now: it changes no schedule, and it waits for no run of that pipeline in flight (the
    dedup key refuses it; ``when`` is its ``scheduled_for``)."""
    return JobSpec(pipeline_id, {TICK_FIELD: when.isoformat(), **payload}, queue=queries.PIPELINE_QUEUE,
                   max_retries=0, dedup_key=queries.PIPELINE_DEDUP_PREFIX + pipeline_id)


async def run_pipeline_job(
    factory: Factory, job: Job, store: Store, stopping: StopSignal | None = None,
) -> dict[str, int] | None:
    """Run ``factory``'s pipeline as ``job`` (its checkpoints, dead letters and progress
    name the job; ``stopping`` ends a resumable one after its current batch). A job whose
    payload has ``replay`` (a limit) sends up to that many of the pipeline's waiting dead
    letters through its steps and sinks again instead, marks them replayed, and returns
    ``{"replayed", "rejected_again"}`` (those rejected again are new dead letters of the job);
    when it raises (a sink down), nothing is marked and the letters wait for the next replay."""
    token = current_run.set(PipelineRun(store, stopping, job))
    try:
        if REPLAY_FIELD not in job.payload:
            async with _built(factory) as pipeline:
                await pipeline.run()
            return None
        state = PipelineState(store)
        letters = await state.waiting_dead_letters(job.kind, int(job.payload[REPLAY_FIELD]))
        if not letters:
            return {"replayed": 0, "rejected_again": 0}
        async with _built(factory) as pipeline:
            if not callable(getattr(pipeline, "replay", None)):
                raise AgoraError(f"pipeline {job.kind}: {type(pipeline).__name__} has no replay(); dead letters "
                                 f"are replayed by pipelines built with Pipeline(...).build(...)")
            again = await pipeline.replay(letters)  # (marks them replayed with the rows it writes)
        return {"replayed": len(letters), "rejected_again": len(again)}
    finally:
        current_run.reset(token)


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


@contextlib.asynccontextmanager
async def _built(factory: Factory) -> AsyncIterator[Any]:
    """``factory()`` (awaited if needed), closed (``close()``/``aclose()``) when done."""
    made = factory()
    pipeline = await made if inspect.isawaitable(made) else made
    try:
        yield pipeline
    finally:
        close = getattr(pipeline, "aclose", None) or getattr(pipeline, "close", None)
        if close is not None:
            result = close()
            if inspect.isawaitable(result):
                await result
