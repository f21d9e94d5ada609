"""The worker's health server serves, besides the database's gauges, the counters and
histograms of the jobs and schedule ticks its process ran."""

from __future__ import annotations

import asyncio
import re
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest

from agora_pg import Fail, Job, Queue, Settings, Worker
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool
from agora_pg.runtime.process_metrics import PROCESS_METRICS

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


async def test_the_health_servers_metrics_count_outcomes_durations_waits_and_schedule_lag(
    queue: Queue, settings: Settings
) -> None:
    for _ in range(5):
        await queue.enqueue("quick", queue="metrics")
    await queue.enqueue("refuse", queue="metrics")
    await queue.enqueue("nobody_handles_this", queue="metrics", max_retries=0)
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
        unknown = 'agora_jobs_completed_total{kind="(unregistered)",outcome="failed",queue="metrics"}'

        async def all_recorded() -> bool:
            text = await _scrape(port)
            return (_value(text, done) - _value(before, done) >= 5 and _value(text, failed) - _value(before, failed) >= 1
                    and _value(text, unknown) - _value(before, unknown) >= 1
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
    assert "# TYPE agora_jobs gauge" in text and "agora_runs_recent{" in text  # the database's gauges too


async def _has_port(pool: WorkerPool) -> bool:
    return pool.health is not None and pool.health.port != 0
