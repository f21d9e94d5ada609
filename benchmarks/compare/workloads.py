"""The workloads, identical for every system."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import asyncpg

from agora_pg.db.connect import Database
from benchmarks.compare.processes import fresh_database, workers
from benchmarks.compare.systems.base import System

DRAIN_TIMEOUT = 900.0
BATCH_ENQUEUE_REPEATS = 5
ENQUEUE_ONE_ROUNDS = 10


# A Python client's single-row insert into a plain table: what a Python job system could
# reach at best, one job per call (pgbench's C client needs no event loop and no encoding).
PLAIN_TABLE = "CREATE TABLE IF NOT EXISTS bench_plain_inserts (id bigserial PRIMARY KEY, payload jsonb NOT NULL)"
PLAIN_INSERT = "INSERT INTO bench_plain_inserts (payload) VALUES ($1::text::jsonb)"


async def plain_insert_seconds(connection: asyncpg.Connection, count: int) -> float:
    """Seconds for ``count`` single-row inserts (one durable commit each) through
    ``connection`` on this event loop, the payload encoded per call as an enqueue does."""
    started = time.perf_counter()
    for index in range(count):
        await connection.execute(PLAIN_INSERT, json.dumps({"i": index}))
    return time.perf_counter() - started


async def enqueue_rates(server: Database, system: System, count: int) -> dict[str, float]:
    """One-at-a-time and batch enqueue rates. The one-at-a-time run is cut into
    ``ENQUEUE_ONE_ROUNDS`` rounds, each after as many plain Python inserts (the machine's
    commit latency drifts within a minute: a ratio of runs far apart says little)."""
    async with fresh_database(server, system, "enq1") as url:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(PLAIN_TABLE)
            await connection.execute(PLAIN_INSERT, json.dumps({"i": -1}))  # (prepared before any clock starts)
            one = plain = 0.0
            for round_ in range(ENQUEUE_ONE_ROUNDS):
                jobs = count // ENQUEUE_ONE_ROUNDS + (round_ < count % ENQUEUE_ONE_ROUNDS)
                plain += await plain_insert_seconds(connection, jobs)
                one += await system.enqueue_one_by_one(url, jobs)
        finally:
            await connection.close()
    async with fresh_database(server, system, "enqb") as url:
        # A 10,000-job batch enqueue takes a few tenths of a second: report the median
        # of several, one after another into the same table.
        batch = statistics.median(
            [await system.enqueue_batch(url, count, warm_up=True) for _ in range(BATCH_ENQUEUE_REPEATS)]
        )
    return {"enqueue_one_per_s": count / one, "enqueue_batch_per_s": count / batch, "plain_insert_per_s": count / plain}


async def drain_rate(server: Database, system: System, jobs: int, processes: int, label: str = "drain") -> float:
    """Jobs per second from the first to the last completion recorded by the system."""
    async with fresh_database(server, system, label) as url:
        return await _drain_once(system, url, jobs, processes)


async def drain_rate_repeated(server: Database, system: System, jobs: int, processes: int, repeats: int) -> float:
    """The median of ``repeats`` drains, each in a fresh database."""
    return statistics.median([await drain_rate(server, system, jobs, processes) for _ in range(repeats)])


async def drain_rate_median(server: Database, system: System, jobs: int, repeats: int, label: str,
                            prepare: object = None, age_runs: object = None) -> float:
    """The median of ``repeats`` one-process drains in one database (prepared once);
    between rounds ``age_runs(url)`` moves the last round's runs out of the measured window.
    A single drain of 20,000 jobs lasts about a second, so one figure varies by +-30 %."""
    rates = []
    async with fresh_database(server, system, label) as url:
        if prepare is not None:
            await prepare(url)  # type: ignore[operator]
        for round_index in range(repeats):
            if round_index and age_runs is not None:
                await age_runs(url)  # type: ignore[operator]
            rates.append(await _drain_once(system, url, jobs, 1))
    return statistics.median(rates)


async def _drain_once(system: System, url: str, jobs: int, processes: int) -> float:
    await system.enqueue_batch(url, jobs)
    with workers(system, url, "drain", processes) as started:
        deadline = time.monotonic() + DRAIN_TIMEOUT
        while await system.done_count(url) < jobs:
            if any(p.poll() is not None for p in started):
                raise RuntimeError(f"{system.name}: a worker exited early")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{system.name}: drain of {jobs} did not finish in {DRAIN_TIMEOUT:.0f}s")
            await asyncio.sleep(0.1)
    return jobs / await system.completion_span_seconds(url)


async def wakeup_latency(server: Database, system: System, jobs: int, per_second: float = 20.0) -> dict[str, float]:
    """Enqueue-to-handler-start latency with one idle worker, jobs sent ~per_second."""
    async with fresh_database(server, system, "lat") as url:
        with workers(system, url, "latency", 1) as started:
            await asyncio.sleep(3.0)  # start-up, then idle
            async with system.latency_client(url) as enqueue:
                for _ in range(jobs):
                    await enqueue()
                    await asyncio.sleep(1.0 / per_second)
            connection = await asyncpg.connect(url)
            try:
                deadline = time.monotonic() + 60
                while await connection.fetchval("SELECT count(*) FROM public.bench_latency") < jobs:
                    if started[0].poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"{system.name}: latency jobs did not all run")
                    await asyncio.sleep(0.1)
                row = await connection.fetchrow(
                    "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY latency_ms) AS p50, "
                    "percentile_cont(0.95) WITHIN GROUP (ORDER BY latency_ms) AS p95, "
                    "percentile_cont(0.99) WITHIN GROUP (ORDER BY latency_ms) AS p99 FROM public.bench_latency"
                )
            finally:
                await connection.close()
    return {"p50": float(row["p50"]), "p95": float(row["p95"]), "p99": float(row["p99"])}
