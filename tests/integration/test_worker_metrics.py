"""The worker's health server serves, besides the database's gauges, the counters and
histograms of the jobs and schedule ticks its process ran."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

import pytest
from litestar.testing import AsyncTestClient
from prometheus_client import CollectorRegistry, generate_latest

from agora_pg import Fail, Job, Queue, Settings, Worker
from agora_pg.api import create_app
from agora_pg.db.store import Store
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool
from agora_pg.runtime.process_metrics import PROCESS_METRICS, ProcessMetrics, merge_snapshots

from .helpers import wait_until


async def quick(job: Job, resources: Any) -> int:
    await asyncio.sleep(0.03)
    return 1


async def refuse(job: Job, resources: Any) -> None:
    raise Fail("no")


class Tick:
    """A pipeline factory whose pipelines do nothing."""

    calls = 0

    async def __call__(self) -> Tick:
        Tick.calls += 1
        return self

    async def run(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def _scrape(port: int) -> str:
    def get() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            return str(response.read().decode())

    return await asyncio.to_thread(get)


def _process_metrics() -> str:
    """This process's counters and histograms, as its health server renders them."""
    registry = CollectorRegistry()
    registry.register(PROCESS_METRICS)
    return str(generate_latest(registry).decode())


def _value(text: str, series: str) -> float:
    """The value of one series (name and labels exactly as rendered), 0 when absent."""
    match = re.search(rf"^{re.escape(series)} (\S+)$", text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@pytest.mark.connections(20)
async def test_the_health_servers_metrics_count_outcomes_durations_waits_and_schedule_lag(
    queue: Queue, settings: Settings
) -> None:
    for _ in range(5):
        await queue.enqueue("quick", queue="metrics")
    await queue.enqueue("refuse", queue="metrics")
    worker = Worker({"quick": quick, "refuse": refuse}, settings=settings.replace(queues=("metrics",)))
    pool = WorkerPool(health_port=0, settings=settings).register(worker).register(
        ScheduledPipeline(Tick(), Schedule.every(seconds=1), "metrics-tick"))
    before = _process_metrics()  # (the process's counters may hold other tests' jobs), before any job runs
    task = asyncio.create_task(pool.run(handle_signals=False))
    try:
        await wait_until(lambda: _has_port(pool), timeout=10)
        assert pool.health is not None
        port = pool.health.port
        done = 'agora_jobs_completed_total{kind="quick",outcome="succeeded",queue="metrics"}'
        failed = 'agora_jobs_completed_total{kind="refuse",outcome="failed",queue="metrics"}'

        async def all_recorded() -> bool:
            text = await _scrape(port)
            return (_value(text, done) - _value(before, done) >= 5 and _value(text, failed) - _value(before, failed) >= 1
                    and _value(text, 'agora_schedule_lag_seconds_count{pipeline_id="metrics-tick"}') >= 1)

        await wait_until(all_recorded, timeout=15)
        text = await _scrape(port)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 15)
    assert _value(text, done) - _value(before, done) == 5
    count = 'agora_job_duration_seconds_count{kind="quick",queue="metrics"}'
    fast = 'agora_job_duration_seconds_bucket{kind="quick",le="0.025",queue="metrics"}'
    slow_enough = 'agora_job_duration_seconds_bucket{kind="quick",le="5.0",queue="metrics"}'
    assert _value(text, count) - _value(before, count) == 5
    assert _value(text, fast) == _value(before, fast)  # each slept 30 ms
    assert _value(text, slow_enough) - _value(before, slow_enough) == 5
    assert _value(text, 'agora_job_wait_seconds_count{kind="quick",queue="metrics"}') >= 5
    lag_sum = _value(text, 'agora_schedule_lag_seconds_sum{pipeline_id="metrics-tick"}')
    assert 0 <= lag_sum < 5 * _value(text, 'agora_schedule_lag_seconds_count{pipeline_id="metrics-tick"}')
    assert "# TYPE agora_jobs gauge" in text and "agora_schedules{" in text  # the database's gauges too


async def _has_port(pool: WorkerPool) -> bool:
    return pool.health is not None and pool.health.port != 0


async def test_the_apis_metrics_sum_every_worker_process_under_the_same_names(
    queue: Queue, settings: Settings, store: Store
) -> None:
    """Each worker process adds what it counted to agora.process_tallies (every 10 s, and
    when it stops); the API's /metrics serves the sum; a process silent for 10 minutes is
    folded into the retired sum, which keeps the total."""
    for _ in range(3):
        await queue.enqueue("tallied", queue="tallies")
    worker = Worker({"tallied": quick}, settings=settings.replace(queues=("tallies",)))
    task = asyncio.create_task(worker.run(handle_signals=False))
    try:
        await wait_until(lambda: _all_done(store, "tallies"), timeout=15)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 15)  # (its stop publishes what it counted)
    other = ProcessMetrics()  # another process, on another host
    other.jobs_recorded([("tallies", "tallied", "succeeded", 0.2, 0.1)])
    other.jobs_recorded([("tallies", "tallied", "failed", 40.0, None)])
    await store.workers.add_tallies("elsewhere:1:x", other.snapshot(), merge_snapshots)
    async with AsyncTestClient(app=create_app(settings), base_url="http://api.localhost:8000") as client:
        text = (await client.get("/metrics")).text
        done = 'agora_jobs_completed_total{kind="tallied",outcome="succeeded",queue="tallies"}'
        assert _value(text, done) == 4
        assert _value(text, 'agora_jobs_completed_total{kind="tallied",outcome="failed",queue="tallies"}') == 1
        assert _value(text, 'agora_job_duration_seconds_bucket{kind="tallied",le="30.0",queue="tallies"}') == 4  # not the 40 s one
        assert _value(text, 'agora_job_duration_seconds_count{kind="tallied",queue="tallies"}') == 5
        # a process silent for 10 minutes is retired: the sum stays, its row goes
        async with store.connection() as connection:
            await connection.execute("UPDATE agora.process_tallies SET published_at = now() - interval '11 minutes' "
                                     "WHERE process_id = 'elsewhere:1:x'")
        assert await store.workers.retire_tallies(600, merge_snapshots) == 1
        assert _value((await client.get("/metrics")).text, done) == 4
        async with store.connection() as connection:
            ids = await connection.fetch("SELECT process_id FROM agora.process_tallies ORDER BY process_id")
        assert "elsewhere:1:x" not in [row["process_id"] for row in ids] and "(retired)" in [r["process_id"] for r in ids]
        # it comes back: it adds only what it counted since, so nothing counts twice
        since = ProcessMetrics()
        since.jobs_recorded([("tallies", "tallied", "succeeded", 0.2, 0.1)])
        await store.workers.add_tallies("elsewhere:1:x", since.snapshot(), merge_snapshots)
        assert _value((await client.get("/metrics")).text, done) == 5


async def _all_done(store: Store, queue_name: str) -> bool:
    async with store.connection() as connection:
        return bool(await connection.fetchval(
            "SELECT count(*) = 3 FROM agora.jobs WHERE queue = $1 AND status = 'done'", queue_name))
