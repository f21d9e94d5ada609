"""The scheduler turns due ticks of periodic jobs into jobs, one pass at a time
(``run_once``), by the database's clock, never twice."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from agora_pg.db.job_rows import JobFinish
from agora_pg.db.schedule_rows import DueTick, TickJob
from agora_pg.db.store import Store
from agora_pg.runner import PeriodicJob, Schedule
from agora_pg.runner.scheduler import MAX_WAIT, Scheduler


async def make_due(store: Store, pipeline_id: str, ago: str = "1 second") -> None:
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE agora.schedules SET next_run_at = now() - $2::text::interval WHERE pipeline_id = $1", pipeline_id, ago
        )


async def jobs_of(store: Store, kind: str) -> list[dict[str, object]]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT id, payload::text, dedup_key FROM agora.jobs WHERE kind = $1", kind)
    return [dict(row) for row in rows]


async def tick_jobs(store: Store, schedule_id: str) -> list[dict[str, object]]:
    """The jobs that run ticks of a schedule, as their columns say."""
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT id, scheduled_for, run_plan FROM agora.jobs WHERE schedule_id = $1 "
                                      "ORDER BY id", schedule_id)
    return [dict(row) for row in rows]


async def tick_runs(store: Store, pipeline_id: str) -> list[dict[str, object]]:
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT job_id, scheduled_for, status FROM agora.runs WHERE pipeline_id = $1 ORDER BY id", pipeline_id
        )
    return [dict(row) for row in rows]


async def test_a_due_tick_becomes_one_job_and_the_schedule_moves_on(store: Store) -> None:
    scheduler = Scheduler(store, [PeriodicJob("report", Schedule.cron("0 8 * * *"), payload={"to": "a"})])
    await scheduler.register()
    assert (await scheduler.run_once()).enqueued == []  # the first tick is tomorrow's (or today's) 08:00
    await make_due(store, "periodic:report", "3 days")  # missed ticks while no worker ran
    first = await scheduler.run_once()
    second = await scheduler.run_once()
    [(tick, job)] = first.enqueued
    assert second.enqueued == []  # one job for the tick that was due; missed ticks are not made up
    assert job.payload == {"to": "a", "scheduled_for": tick.tick.isoformat()}
    assert job.dedup_key == f"periodic:report@{tick.tick.isoformat()}"
    row = scheduler.rows["periodic:report"]
    now = await store.database_now()
    assert row.next_run_at is not None and now < row.next_run_at <= now + timedelta(days=1)
    assert row.next_run_at.hour == 8 and row.next_run_at.minute == 0
    assert await tick_jobs(store, "periodic:report") == [{"id": job.id, "scheduled_for": tick.tick, "run_plan": None}]
    assert await tick_runs(store, "periodic:report") == []  # its run is recorded when the job's attempt ends
    assert 0 < second.wait_seconds <= MAX_WAIT


async def test_a_ticks_runs_record_what_its_job_did(store: Store) -> None:
    scheduler = Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1), max_retries=2)])
    await scheduler.register()
    [(tick, job)] = (await scheduler.run_once()).enqueued
    for _attempt in (1, 2):  # its one retry fails too: the job fails for good
        await store.jobs.promote_due(100)
        [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["report"])
        failure = JobFinish(claimed.id, claimed.attempt, "failed", "ValueError", "ValueError: no", None, 0, False)
        assert await store.jobs.finish([failure], "w", 3, 3) == {job.id}
    assert (await store.jobs.get(job.id)).status.value == "failed"
    assert await tick_runs(store, "periodic:report") == [
        {"job_id": job.id, "scheduled_for": tick.tick, "status": status} for status in ("failed", "failed")]
    row = await store.schedules.get("periodic:report")
    assert row is not None and (row.last_status, row.last_error) == ("failed", "ValueError: no")
    assert row.consecutive_errors == 0 and row.state == "active"  # (a periodic job's retries are its own)


async def test_schedulers_of_many_processes_enqueue_each_tick_once(store: Store) -> None:
    schedulers = [Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1))]) for i in range(4)]
    for scheduler in schedulers:
        await scheduler.register()
    for _round in range(2):  # the first tick: due at registration
        await asyncio.gather(*(scheduler.run_once() for scheduler in schedulers))
    await make_due(store, "periodic:report")
    for _round in range(3):
        await asyncio.gather(*(scheduler.run_once() for scheduler in schedulers))
    assert len(await jobs_of(store, "report")) == 2  # the first tick, and the one made due
    assert len(await tick_jobs(store, "periodic:report")) == 2


async def test_a_pass_that_fails_midway_writes_nothing_and_the_next_one_enqueues_the_tick(store: Store) -> None:
    scheduler = Scheduler(store, [PeriodicJob("report", Schedule.every(minutes=5))])
    await scheduler.register()

    def plan_that_breaks(due: DueTick) -> TickJob:
        raise RuntimeError("the process died while planning")

    with pytest.raises(RuntimeError):
        await store.schedules.enqueue_due_ticks(scheduler.wanted, plan_that_breaks)
    assert await jobs_of(store, "report") == [] and await tick_runs(store, "periodic:report") == []
    [(tick, _job)] = (await scheduler.run_once()).enqueued  # still due: nothing of the failed pass stayed
    next_run_at = scheduler.rows["periodic:report"].next_run_at
    assert next_run_at is not None  # every(minutes=5): five minutes after the pass, by the database clock
    assert timedelta(minutes=5) <= next_run_at - tick.tick <= timedelta(minutes=5, seconds=10)


async def test_paused_and_completed_schedules_enqueue_nothing_and_a_trigger_enqueues_at_once(store: Store) -> None:
    scheduler = Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1)),
                                        PeriodicJob("once", Schedule.once(key="2024"))])
    await scheduler.register()
    first = await scheduler.run_once()
    assert sorted(tick.pipeline_id for tick, _ in first.enqueued) == ["periodic:once", "periodic:report"]
    assert scheduler.rows["periodic:once"].state == "completed"
    await store.schedules.pause("periodic:report")
    await make_due(store, "periodic:report")
    assert (await scheduler.run_once()).enqueued == []
    await store.schedules.resume("periodic:report")
    await store.schedules.trigger("periodic:report")
    [(tick, _job)] = (await scheduler.run_once()).enqueued
    assert tick.pipeline_id == "periodic:report"
    await scheduler.register()  # a new launch: once(key=...) never runs again
    assert all(tick.pipeline_id != "periodic:once" for tick, _ in (await scheduler.run_once()).enqueued)


async def test_a_pipeline_run_enqueued_ahead_is_claimable_from_its_tick_and_wakes_its_worker_then(
    store: Store, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from agora_pg.db import queries
    from agora_pg.db.schedule_rows import ScheduleRegistration
    from agora_pg.runner import ScheduledPipeline, scheduler as scheduler_module

    monkeypatch.setattr(scheduler_module, "AHEAD_SECONDS", 3.0)  # (room for a busy machine before the tick)
    pipeline = ScheduledPipeline(lambda: None, Schedule.every(seconds=5), "soon")
    tick_at = await store.database_now() + timedelta(seconds=1)
    await store.schedules.upsert(ScheduleRegistration("soon", "every", pipeline.schedule.spec, tick_at, 60, 10))
    scheduler = Scheduler(store, [pipeline])
    woken = asyncio.Event()
    scheduler.on_tick = woken.set
    [(tick, job)] = (await scheduler.run_once()).enqueued
    assert tick.tick == tick_at and job.run_at == tick_at
    async with store.connection() as connection:  # in the claim index now: no promotion at the tick
        assert await connection.fetchval("SELECT delayed FROM agora.jobs WHERE id = $1", job.id) is False
    assert await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "w1", 30, kinds=["soon"]) == []  # not before its tick
    await asyncio.wait_for(woken.wait(), 5)
    assert await store.database_now() >= tick_at  # woken at its tick, not before
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "w1", 30, kinds=["soon"])
    assert claimed.id == job.id
