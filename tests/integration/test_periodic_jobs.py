"""Periodic jobs: a schedule that enqueues one job of a kind per tick, however many
workers register it, with the tick's time in the payload."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime
from typing import Any

import pytest
from litestar.testing import AsyncTestClient

from agora_pg import InvalidJob, Job, JobStatus, Queue, Settings, Worker
from agora_pg.api import create_app
from agora_pg.db.store import Store
from agora_pg.runner import PeriodicJob, Schedule, WorkerPool

from .helpers import wait_until

SEEN: list[dict[str, Any]] = []


async def report(job: Job, resources: Any) -> None:
    SEEN.append(job.payload)


@pytest.mark.connections(16)
async def test_two_pools_enqueue_one_job_per_tick_and_a_worker_runs_them(
    store: Store, queue: Queue, settings: Settings
) -> None:
    SEEN.clear()

    def periodic() -> PeriodicJob:
        return PeriodicJob("report", Schedule.every(seconds=1), payload={"to": "team"}, queue="reports",
                           priority=3)

    first = WorkerPool(settings=settings).register(periodic()).register(
        Worker({"report": report}, settings=settings.replace(queues=("reports",))))
    second = WorkerPool(settings=settings).register(periodic())  # another process registering the same job
    tasks = [asyncio.create_task(pool.run(handle_signals=False)) for pool in (first, second)]

    async def three_done() -> bool:
        async with store.connection() as connection:
            return int(await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE kind = 'report' "
                                                 "AND status = 'done'")) >= 3

    await wait_until(three_done, timeout=60, what="three ticks' jobs done")
    for pool in (first, second):
        pool.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 20)

    async with store.connection() as connection:
        runs = await connection.fetch("SELECT scheduled_for, status FROM agora.runs WHERE pipeline_id = 'periodic:report'")
        rows = await connection.fetch("SELECT id FROM agora.jobs WHERE kind = 'report' ORDER BY id")
    jobs = [await queue.get(row["id"]) for row in rows]
    assert len(jobs) >= 3, jobs
    ticks = [job.payload["scheduled_for"] for job in jobs]
    assert len(set(ticks)) == len(ticks)  # one job per tick, whichever pool claimed it
    assert sorted(ticks) == sorted(run["scheduled_for"].isoformat() for run in runs if run["status"] == "succeeded")
    assert all(run["status"] == "succeeded" for run in runs)
    for job in jobs:
        assert job.payload["to"] == "team" and (job.queue, job.priority) == ("reports", 3)
        assert job.dedup_key == f"periodic:report@{job.payload['scheduled_for']}"
        assert datetime.fromisoformat(job.payload["scheduled_for"]).tzinfo is not None
    done = [job for job in jobs if job.status is JobStatus.DONE]
    assert len(done) >= len(jobs) - 1 and len(SEEN) == len(done)  # the last tick's job may still wait

    async with AsyncTestClient(app=create_app(settings), base_url="http://api.localhost:8000") as client:
        [listed] = (await client.get("/schedules")).json()
    assert (listed["pipeline_id"], listed["job_kind"], listed["schedule_kind"]) == ("periodic:report", "report", "every")


def test_a_periodic_job_is_checked_when_it_is_made() -> None:
    with pytest.raises(InvalidJob, match="kind"):
        PeriodicJob("", Schedule.every(minutes=1))
    with pytest.raises(InvalidJob, match="queue"):
        PeriodicJob("report", Schedule.every(minutes=1), queue=" padded ")
    with pytest.raises(ValueError, match="Schedule.continuous would enqueue without pause"):
        PeriodicJob("report", Schedule.continuous())
    with pytest.raises(ValueError, match="payload must not hold 'scheduled_for'"):
        PeriodicJob("report", Schedule.every(minutes=1), payload={"scheduled_for": "now"})
    job = PeriodicJob("report", Schedule.cron("0 8 * * *"), pipeline_id="morning-report")
    assert (job.pipeline_id, job.job_kind) == ("morning-report", "report")


async def test_ticks_are_enqueued_once_each_while_the_schedulers_connections_are_killed(
    store: Store, settings: Settings, database_url: str
) -> None:
    """Two pools enqueue an every(1s) periodic job while every backend of the database
    but the test's is terminated every 0.3 s: each tick is one job,
    nothing is enqueued twice, and once the kills stop the ticks come again (on a busy
    machine, every pass may be cut short while the kills last, and the schedulers' retries
    back off up to 10 s)."""
    pools = [WorkerPool(settings=settings).register(PeriodicJob("beat", Schedule.every(seconds=1))) for _ in range(2)]
    tasks = [asyncio.create_task(pool.run(handle_signals=False)) for pool in pools]
    killed = 0
    async with store.connection() as killer:
        for _ in range(20):  # 6 s
            await asyncio.sleep(0.3)
            killed += await killer.fetchval(
                "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t"
            )

    async def ticked_after_the_kills(since: datetime) -> bool:
        async with store.connection() as connection:
            return bool(await connection.fetchval(
                "SELECT count(*) FROM agora.jobs WHERE schedule_id = 'periodic:beat' AND created_at > $1", since))

    kills_ended = await store.database_now()
    await wait_until(lambda: ticked_after_the_kills(kills_ended), what="a tick after the kills")
    for pool in pools:
        pool.stop()
    await asyncio.wait_for(asyncio.gather(*tasks), 30)
    async with store.connection() as connection:
        ticks = [row["scheduled_for"] for row in await connection.fetch(
            "SELECT scheduled_for FROM agora.jobs WHERE schedule_id = 'periodic:beat' ORDER BY scheduled_for")]
        keys = [row["dedup_key"] for row in await connection.fetch(
            "SELECT dedup_key FROM agora.jobs WHERE kind = 'beat' ORDER BY id")]
    assert killed > 0
    assert ticks and len(keys) == len(ticks) == len(set(keys)) == len(set(ticks))
    assert sorted(keys) == sorted(f"periodic:beat@{tick.isoformat()}" for tick in ticks)


async def test_a_pool_warns_of_a_periodic_jobs_queue_its_worker_does_not_claim(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    async def send_report(job: Job, resources: Any) -> None:
        pass

    pool = (WorkerPool(settings=settings).register(Worker({"send_report": send_report}, settings=settings))
            .register(PeriodicJob("send_report", Schedule.every(hours=1), queue="reports")))
    caplog.set_level(logging.WARNING, logger="agora_pg")
    task = asyncio.create_task(pool.run(handle_signals=False))

    async def warned() -> bool:
        return "periodic job" in caplog.text

    try:
        await wait_until(warned)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 30)
    assert ("periodic job 'send_report' enqueues into queue 'reports', which this pool's worker does not claim "
            "(queues=default): run it with --queues default,reports") in caplog.text
