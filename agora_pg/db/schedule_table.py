"""The ``agora.schedules`` statements: registration, ticks, pause, resume, trigger."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from agora_pg.db import queries
from agora_pg.db.connections import StatementRunner
from agora_pg.db.enqueue import insert_jobs
from agora_pg.db.schedule_rows import DueTick, NextTicks, ScheduleRegistration, ScheduleRow, TickJob
from agora_pg.errors import ScheduleConflict, ScheduleNotFound
from agora_pg.jobs import Job

# A job that runs a tick: (job id, schedule id, tick, run plan or None, the schedule's next run)
TickMark = tuple[int, str, datetime, dict[str, Any] | None, datetime | None]


async def record_ticks(connection: Any, ticks: Sequence[TickMark]) -> None:
    """Mark jobs just inserted on ``connection`` (in its transaction) as the runs of their
    ticks (``queries.RECORD_TICKS``)."""
    if ticks:
        job_ids, schedule_ids, times, plans, next_runs = zip(*ticks, strict=True)
        await connection.execute(queries.RECORD_TICKS, list(job_ids), list(schedule_ids), list(times),
                                 [None if plan is None else json.dumps(plan) for plan in plans], list(next_runs))


class ScheduleTable:
    """Reached as ``store.schedules``; runs its statements through the Store's connections."""

    def __init__(self, store: StatementRunner) -> None:
        self._store = store

    async def upsert(self, registration: ScheduleRegistration) -> ScheduleRow:
        r = registration
        rows = await self._store.fetch(queries.UPSERT_SCHEDULE, r.pipeline_id, r.kind, r.spec, r.first_run_at,
                                       r.error_backoff_seconds, r.max_consecutive_errors, r.new_launch, r.job_kind)
        return ScheduleRow.from_row(rows[0])

    async def launch_once_again(self, pipeline_id: str, spec: str) -> ScheduleRow | None:
        """Make a completed once-per-launch schedule due now (another launch completed it
        meanwhile); None if it is not completed (any more)."""
        rows = await self._store.fetch(queries.LAUNCH_ONCE_AGAIN, pipeline_id, spec)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def get(self, pipeline_id: str) -> ScheduleRow | None:
        rows = await self._store.fetch(queries.SELECT_SCHEDULE, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def declared(self, pipeline_ids: Sequence[str]) -> dict[str, ScheduleRow]:
        """The rows of the schedules ``pipeline_ids`` that this process declares (one
        statement, which records that a live process declares them), by pipeline id; a
        schedule without a row (deleted) is absent."""
        rows = await self._store.fetch(queries.SELECT_DECLARED_SCHEDULES, list(pipeline_ids))
        return {row["pipeline_id"]: ScheduleRow.from_row(row) for row in rows}

    async def enqueue_due_ticks(
        self, wanted: Sequence[tuple[str, str]], plan: Callable[[DueTick], TickJob],
        ahead_seconds: float = 0.0, launches: Mapping[str, str] | None = None,
    ) -> list[tuple[TickJob, Job]]:
        """Turn the due ticks of the schedules ``wanted`` ((pipeline id, spec) pairs) into
        jobs, in one transaction: lock them, ``plan`` each (pure: the job and the next run),
        insert the jobs, mark each with its schedule and tick, and advance the schedules
        of periodic jobs (a pipeline's run sets its schedule's next run when it ends). Ticks another
        process is enqueueing, and pipelines whose run is still alive, are skipped. Ticks due
        within ``ahead_seconds`` are taken too (``plan`` makes their jobs due at the tick; a
        pipeline's run enters the claim index at once, to be claimed from its tick on).
        ``launches``: the launch of each once-per-launch pipeline, which is not due once a
        run of that launch succeeded."""
        ids, specs, launch_ids = _wanted(wanted, launches)
        async with self._store.connection() as connection, connection.transaction():
            rows = await connection.fetch(queries.DUE_TICKS, ids, specs, float(ahead_seconds), launch_ids)
            if not rows:
                return []
            ticks = [plan(DueTick(row["pipeline_id"], row["tick"], row["database_now"])) for row in rows]
            jobs = [job for job, _inserted in await insert_jobs(connection.fetch, [tick.job for tick in ticks])]
            await record_ticks(connection, [(job.id, tick.pipeline_id, tick.tick, tick.run_plan, tick.next_run_at)
                                            for tick, job in zip(ticks, jobs, strict=True)])
        return list(zip(ticks, jobs, strict=True))

    async def next_ticks(self, wanted: Sequence[tuple[str, str]], launches: Mapping[str, str] | None = None) -> NextTicks:
        """When the schedules ``wanted`` next need this process, by the database's clock."""
        [row] = await self._store.fetch(queries.NEXT_TICK_IN, *_wanted(wanted, launches))
        return NextTicks(*(None if row[name] is None else float(row[name]) for name in ("seconds", "run_in")))

    async def launch_succeeded(self, pipeline_id: str, launch: str) -> bool:
        """Whether a run of once-per-launch pipeline ``pipeline_id`` by ``launch`` succeeded
        (whichever process ran it)."""
        [row] = await self._store.fetch(queries.LAUNCH_SUCCEEDED, pipeline_id, launch)
        return bool(row[0])

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

    async def delete(self, pipeline_id: str) -> tuple[ScheduleRow, int]:
        """Delete a schedule and its future ticks (``queries.DELETE_SCHEDULE``); its runs
        stay. Returns the schedule as it was and how many jobs of its ticks were cancelled."""
        rows = await self._store.fetch(queries.DELETE_SCHEDULE, pipeline_id)
        if not rows:
            raise ScheduleNotFound(pipeline_id)
        return ScheduleRow.from_row(rows[0]), int(rows[0]["cancelled_jobs"])

    async def orphaned(self, declared: Sequence[str] = ()) -> list[str]:
        """The orphaned schedules, other than ``declared``."""
        return [row["pipeline_id"] for row in await self._store.fetch(queries.ORPHANED_SCHEDULES, list(declared))]

    async def _change(self, statement: str, pipeline_id: str, action: str, problem: str) -> ScheduleRow:
        rows = await self._store.fetch(statement, pipeline_id)
        if rows:
            return ScheduleRow.from_row(rows[0])
        row = await self.get(pipeline_id)
        if row is None:
            raise ScheduleNotFound(pipeline_id)
        state = "running" if row.state == "active" and row.job_id is not None else row.state
        raise ScheduleConflict(pipeline_id, state, action, problem)


def _wanted(
    wanted: Sequence[tuple[str, str]], launches: Mapping[str, str] | None,
) -> tuple[list[str], list[str], list[str]]:
    """The arrays of _WANTED: pipeline ids, specs, and launches ('' for none)."""
    launches = launches or {}
    return ([pipeline_id for pipeline_id, _ in wanted], [spec for _, spec in wanted],
            [launches.get(pipeline_id, "") for pipeline_id, _ in wanted])
