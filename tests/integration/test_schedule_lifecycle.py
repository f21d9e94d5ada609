"""A schedule's lifecycle: declared by the processes whose code registers it, orphaned
when none has for a while, deleted by hand (API, CLI) or retired by a pool that asks."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import timedelta

import httpx
import pytest

from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.runner import PeriodicJob, Schedule, ScheduledPipeline
from agora_pg.runner.scheduler import Scheduler
from agora_pg.schedules import SCHEDULE_ORPHANED_AFTER_SECONDS
from agora_pg.settings import Settings

from .helpers import record_failure
from .test_api import api_client
from .test_scheduler import make_due


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as test_client:
        yield test_client


async def _never_built() -> object:
    """A pipeline factory these tests never reach: they play its worker."""
    raise AssertionError("not built here")


async def _last_declared(store: Store, pipeline_id: str, seconds_ago: float) -> None:
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.schedules SET declared_at = now() - make_interval(secs => $2) "
                                 "WHERE pipeline_id = $1", pipeline_id, seconds_ago)


async def _job_statuses(store: Store, kind: str) -> list[str]:
    async with store.connection() as connection:
        return [row[0] for row in await connection.fetch("SELECT status FROM agora.jobs WHERE kind = $1 ORDER BY id",
                                                         kind)]


async def test_a_schedule_no_process_declares_shows_as_orphaned_until_one_does_again(
    store: Store, client: httpx.AsyncClient
) -> None:
    scheduler = Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1))])
    await scheduler.register()
    assert (await client.get("/schedules/periodic:report")).json()["orphaned_since"] is None
    await _last_declared(store, "periodic:report", SCHEDULE_ORPHANED_AFTER_SECONDS + 5)
    orphaned = (await client.get("/schedules/periodic:report")).json()
    assert orphaned["orphaned_since"] is not None
    assert "agora_schedules_orphaned 1.0" in (await client.get("/metrics")).text
    page = (await client.get("/ui/fragments/schedules")).text
    assert "orphaned" in page and "No live worker has declared this schedule since" in page
    await scheduler.run_once()  # (a live process's pass declares it again)
    assert (await client.get("/schedules/periodic:report")).json()["orphaned_since"] is None
    assert "agora_schedules_orphaned 0.0" in (await client.get("/metrics")).text


async def test_deleting_a_schedule_cancels_its_future_ticks_keeps_its_history_and_stays_deleted(
    store: Store, client: httpx.AsyncClient
) -> None:
    serving = Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1))])
    await serving.register()
    await make_due(store, "periodic:report", "2 hours")
    [(_tick, ran)] = (await serving.run_once()).enqueued  # a tick that was due: its job ran, its run is history
    [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["report"])
    assert await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w") == {ran.id}
    # and the next tick's, enqueued ahead of its tick (a scheduler takes ticks due within 0.2 s;
    # within two hours here, so that it is still ahead when deleted)
    [(_ahead_tick, ahead)] = await store.schedules.enqueue_due_ticks(
        serving.wanted, lambda due: serving.schedules[due.pipeline_id].plan(due), ahead_seconds=7200)
    assert await _job_statuses(store, "report") == ["done", "pending"]
    response = await client.delete("/schedules/periodic:report")
    assert response.status_code == 200 and response.json()["pipeline_id"] == "periodic:report"
    assert (await client.get("/schedules/periodic:report")).status_code == 404
    assert (await client.delete("/schedules/periodic:report")).status_code == 404
    assert await _job_statuses(store, "report") == ["done", "cancelled"]
    assert (await store.jobs.get(ahead.id)).status.value == "cancelled" and ran.id != ahead.id
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.runs WHERE pipeline_id = 'periodic:report'") == 1
    # the process that served it runs no more of its ticks, and says so
    assert (await serving.run_once()).enqueued == [] and serving.deleted == {"periodic:report"}
    # a process whose code does not declare it never brings it back; one whose code does, does
    await Scheduler(store, [PeriodicJob("other", Schedule.every(hours=1))]).register()
    assert await store.schedules.get("periodic:report") is None
    await Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1))]).register()
    assert await store.schedules.get("periodic:report") is not None


async def test_the_cli_deletes_a_schedule_and_an_unknown_one_is_one_line(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agora_pg.cli import main

    await Scheduler(store, [PeriodicJob("report", Schedule.every(hours=1))]).register()
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    assert await asyncio.to_thread(main, ["schedules", "delete", "periodic:report"]) == 0
    assert "deleted, with 0 job(s) of its future ticks cancelled; its runs stay" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["schedules", "delete", "periodic:report"]) != 0
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("agora-pg:")]
    assert len(errors) == 1 and "periodic:report" in errors[0], errors


async def test_a_pool_that_retires_undeclared_schedules_deletes_the_orphans_of_other_code(store: Store) -> None:
    await Scheduler(store, [PeriodicJob("gone", Schedule.every(hours=1)),
                                   PeriodicJob("recent", Schedule.every(hours=1))]).register()
    await _last_declared(store, "periodic:gone", SCHEDULE_ORPHANED_AFTER_SECONDS + 5)
    mine = Scheduler(store, [PeriodicJob("kept", Schedule.every(hours=1))], retire_undeclared=True)
    await mine.register()
    await _last_declared(store, "periodic:kept", SCHEDULE_ORPHANED_AFTER_SECONDS + 5)  # (its own: never retired)
    await mine.run_once()
    assert [row.pipeline_id for row in await store.schedules.all()] == ["periodic:kept", "periodic:recent"]
    polite = Scheduler(store, [PeriodicJob("x", Schedule.every(hours=1))])  # (the default: retires none)
    await polite.register()
    await _last_declared(store, "periodic:recent", SCHEDULE_ORPHANED_AFTER_SECONDS + 5)
    await polite.run_once()
    assert await store.schedules.get("periodic:recent") is not None


async def test_a_failed_run_retried_by_hand_later_never_moves_its_schedule_backwards(store: Store) -> None:
    scheduler = Scheduler(store, [ScheduledPipeline(_never_built, Schedule.every(hours=1), "hourly")])
    await scheduler.register()
    await make_due(store, "hourly")
    [(_tick, job)] = (await scheduler.run_once()).enqueued
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "w1", 30, kinds=["hourly"])
    await record_failure(store, claimed.id, claimed.attempt, "w1", "boom")
    failed = await store.schedules.get("hourly")
    assert failed is not None and failed.consecutive_errors == 1
    async with store.connection() as connection:  # later ticks ran and succeeded meanwhile
        later = await connection.fetchval("UPDATE agora.schedules SET next_run_at = now() + interval '5 hours', "
                                          "consecutive_errors = 0 WHERE pipeline_id = 'hourly' RETURNING next_run_at")
    await store.jobs.retry(job.id)  # the old run, by hand: its payload's next run is an hour after its tick
    [again] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "w1", 30, kinds=["hourly"])
    await store.jobs.complete_succeeded([(again.id, again.attempt)], "w1")
    after = await store.schedules.get("hourly")
    assert after is not None and (after.last_status, after.next_run_at) == ("succeeded", later)


async def test_a_scheduled_run_cancelled_before_it_starts_skips_its_tick(store: Store) -> None:
    scheduler = Scheduler(store, [ScheduledPipeline(_never_built, Schedule.every(hours=1), "hourly")])
    await scheduler.register()
    await make_due(store, "hourly")
    [(tick, job)] = (await scheduler.run_once()).enqueued
    await store.jobs.cancel(job.id)
    assert (await scheduler.run_once()).enqueued == []  # the tick is skipped, not enqueued again
    row = await store.schedules.get("hourly")
    assert row is not None and row.state == "active" and row.next_run_at is not None
    assert tick.run_plan is not None and "next_in_seconds" in tick.run_plan  # (every: the next run an hour after the skipped one's end)
    assert row.next_run_at > tick.tick + timedelta(minutes=59)


async def test_a_job_that_only_looks_like_a_run_changes_no_schedule(store: Store) -> None:
    """What a run's end writes to its schedule comes from the job's columns (schedule_id,
    run_plan), never from its queue's name or its payload: a job written by SQL into the
    pipelines' queue, of the pipeline's kind, with a payload naming a next run, is a plain
    job, and its failure neither counts against the schedule nor moves it."""
    scheduler = Scheduler(store, [ScheduledPipeline(_never_built, Schedule.every(hours=1), "hourly")])
    await scheduler.register()
    before = await store.schedules.get("hourly")
    async with store.connection() as connection:
        job_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind, queue, payload, max_retries) VALUES ('x', 'hourly', $1, "
            """'{"spec": "every 3600s", "next_at": "2099-01-01T00:00:00+00:00", "scheduled_for": "2026-01-01T00:00:00+00:00"}', 0)"""
            " RETURNING id", queries.PIPELINE_QUEUE)
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "w1", 30, kinds=["hourly"])
    assert claimed.id == job_id
    await record_failure(store, job_id, claimed.attempt, "w1", "boom")
    after = await store.schedules.get("hourly")
    assert before is not None and after is not None
    assert (after.next_run_at, after.consecutive_errors, after.last_status) == (before.next_run_at, 0, None)
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT pipeline_id FROM agora.runs WHERE job_id = $1", job_id) is None
