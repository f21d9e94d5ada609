"""The ``agora.schedules`` statements: registration, ticks, pipeline runs, pause, resume, trigger."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from agora_pg.db import queries
from agora_pg.db.enqueue import insert_jobs
from agora_pg.db.schedule_rows import (
    ClaimedRun,
    DueTick,
    RunFinish,
    ScheduleRegistration,
    ScheduleRow,
    TickJob,
)
from agora_pg.errors import (
    ScheduleConflict,
    ScheduleNotFound,
)
from agora_pg.jobs import Job

if TYPE_CHECKING:
    from agora_pg.db.store import Store


class ScheduleTable:
    """Reached as ``store.schedules``; runs its statements through the Store's connections."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def upsert(self, registration: ScheduleRegistration) -> ScheduleRow:
        rows = await self._store.fetch(
            queries.UPSERT_SCHEDULE,
            registration.pipeline_id,
            registration.kind,
            registration.spec,
            registration.first_run_at,
            registration.error_backoff_seconds,
            registration.max_consecutive_errors,
            registration.new_launch,
            registration.job_kind,
        )
        return ScheduleRow.from_row(rows[0])

    async def launch_once_again(self, pipeline_id: str, spec: str) -> ScheduleRow | None:
        """Make a completed once-per-launch schedule due now (another launch completed it
        meanwhile); None if it is not completed (any more)."""
        rows = await self._store.fetch(queries.LAUNCH_ONCE_AGAIN, pipeline_id, spec)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def get(self, pipeline_id: str) -> ScheduleRow | None:
        rows = await self._store.fetch(queries.SELECT_SCHEDULE, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def get_many(self, pipeline_ids: Sequence[str]) -> dict[str, ScheduleRow]:
        """The schedule rows of ``pipeline_ids`` (one statement), by pipeline id; a
        pipeline without one is absent."""
        rows = await self._store.fetch(queries.SELECT_SCHEDULES, list(pipeline_ids))
        return {row["pipeline_id"]: ScheduleRow.from_row(row) for row in rows}

    async def enqueue_due_ticks(
        self, wanted: Sequence[tuple[str, str]], plan: Callable[[DueTick], TickJob], worker_id: str
    ) -> list[tuple[TickJob, Job]]:
        """Turn the due ticks of the schedules ``wanted`` ((pipeline id, spec) pairs) into
        jobs, in one transaction: lock them, ``plan`` each (pure: the job and the next run),
        insert the jobs, advance the schedules and record each tick as a run. Ticks another
        process is enqueueing are skipped."""
        ids, specs = [pipeline_id for pipeline_id, _ in wanted], [spec for _, spec in wanted]
        async with self._store.connection() as connection, connection.transaction():
            rows = await connection.fetch(queries.DUE_TICKS, ids, specs)
            if not rows:
                return []
            ticks = [plan(DueTick(row["pipeline_id"], row["tick"], row["database_now"])) for row in rows]
            jobs = [job for job, _inserted in await insert_jobs(connection.fetch, [tick.job for tick in ticks])]
            await connection.execute(
                queries.RECORD_TICKS, [tick.pipeline_id for tick in ticks], [tick.tick for tick in ticks],
                [job.id for job in jobs], [tick.next_run_at for tick in ticks], worker_id,
            )
        return list(zip(ticks, jobs, strict=True))

    async def next_tick_in(self, wanted: Sequence[tuple[str, str]]) -> float | None:
        """Seconds until the first of the schedules ``wanted`` falls due (None: none is active)."""
        ids, specs = [pipeline_id for pipeline_id, _ in wanted], [spec for _, spec in wanted]
        async with self._store.connection() as connection:
            seconds = await connection.fetchval(queries.NEXT_TICK_IN, ids, specs)
        return None if seconds is None else float(seconds)

    async def claim_runs(
        self, pipelines: Sequence[tuple[str, str]], worker_id: str, lease_seconds: float
    ) -> dict[str, ClaimedRun]:
        """Claim the due runs of ``(pipeline_id, spec)`` pairs in one statement; the claimed
        ones by pipeline id (one not due, leased elsewhere or registered with another spec
        is absent). Pipeline ids must be distinct."""
        async with self._store.connection() as connection:
            sent_at = time.monotonic()
            rows = await connection.fetch(
                queries.CLAIM_PIPELINE_RUNS, [pipeline_id for pipeline_id, _ in pipelines], worker_id,
                [spec for _, spec in pipelines], float(lease_seconds),
            )
        return {
            row["pipeline_id"]: ClaimedRun(
                ScheduleRow.from_row(row), run_id=row["run_id"], scheduled_for=row["scheduled_for"],
                database_now=row["database_now"], sent_at=sent_at,
            )
            for row in rows
        }

    async def claim_run(
        self, pipeline_id: str, spec: str, worker_id: str, lease_seconds: float
    ) -> ClaimedRun | None:
        """Claim the pipeline's due run, or None when it is not due, leased or not ours."""
        return (await self.claim_runs([(pipeline_id, spec)], worker_id, lease_seconds)).get(pipeline_id)

    async def rescue_run(self, pipeline_id: str) -> ScheduleRow | None:
        """Take the run over from a worker whose lease expired (counted as a failed run);
        the schedule's new row, or None when there was nothing to take over."""
        rows = await self._store.fetch(queries.RESCUE_PIPELINE_RUN, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def finish_runs(self, finishes: Sequence[RunFinish]) -> set[str]:
        """Record runs' ends in one statement; the pipeline ids whose run was recorded (one
        absent: its worker no longer held the lease). Pipeline ids must be distinct."""
        columns = (
            "pipeline_id", "worker_id", "run_id", "status", "error_type", "error_message", "consecutive_errors",
            "next_run_at", "state", "next_run_in_seconds", "traceback",
        )
        rows = await self._store.fetch(
            queries.FINISH_PIPELINE_RUNS, *([getattr(finish, column) for finish in finishes] for column in columns)
        )
        return {row["pipeline_id"] for row in rows}

    async def finish_run(self, finish: RunFinish) -> bool:
        """Record a run's end; False if this worker no longer held the lease."""
        return finish.pipeline_id in await self.finish_runs([finish])

    async def release_run(self, pipeline_id: str, worker_id: str, run_id: int) -> bool:
        rows = await self._store.fetch(queries.RELEASE_PIPELINE_RUN, pipeline_id, worker_id, run_id)
        return bool(rows)

    async def all(self) -> list[ScheduleRow]:
        return [ScheduleRow.from_row(row) for row in await self._store.fetch(queries.LIST_SCHEDULES)]

    async def pause(self, pipeline_id: str) -> ScheduleRow:
        """Stop starting runs of a schedule until it is resumed."""
        return await self._change(
            queries.PAUSE_SCHEDULE, pipeline_id, "pause", "only an active schedule pauses"
        )

    async def resume(self, pipeline_id: str) -> ScheduleRow:
        """Start a paused or stopped schedule again."""
        return await self._change(
            queries.RESUME_SCHEDULE, pipeline_id, "resume", "a completed once schedule does not run again"
        )

    async def trigger(self, pipeline_id: str) -> ScheduleRow:
        """Make an active, idle schedule due now (it runs once, then on its schedule)."""
        return await self._change(
            queries.TRIGGER_SCHEDULE, pipeline_id, "trigger",
            "only an active schedule that is not running can be triggered",
        )

    async def _change(self, statement: str, pipeline_id: str, action: str, problem: str) -> ScheduleRow:
        rows = await self._store.fetch(statement, pipeline_id)
        if rows:
            return ScheduleRow.from_row(rows[0])
        row = await self.get(pipeline_id)
        if row is None:
            raise ScheduleNotFound(pipeline_id)
        state = "running" if row.state == "active" and row.lease_owner is not None else row.state
        raise ScheduleConflict(pipeline_id, state, action, problem)
