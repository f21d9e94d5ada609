"""agora-pg, through its public API: Queue for enqueues, `agora-pg worker` processes."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg

from agora_pg import JobSpec, Queue
from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from benchmarks.compare.systems.base import Mode, System, latency_payload, python_module_command

CONCURRENCY = int(os.environ.get("BENCH_AGORA_CONCURRENCY", "500"))
# The concurrency of the second server-work drain: the claim's cost when it asks for few rows.
LOW_CONCURRENCY = 10


class AgoraSystem(System):
    key = "agora"
    name = "agora-pg 0.1.0"

    def __init__(self, concurrency: int = CONCURRENCY) -> None:
        self.concurrency = concurrency

    def describe(self) -> str:
        return f"--concurrency {self.concurrency}, LISTEN/NOTIFY on, poll 1 s"

    async def setup(self, url: str) -> None:
        store = Store.open(Database(url), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()

    async def enqueue_one_by_one(self, url: str, count: int) -> float:
        async with Queue.connect(url) as queue:
            await queue.store.ping()  # connect before the clock starts, as the peers do
            started = time.perf_counter()
            for index in range(count):
                await queue.enqueue("noop", {"i": index})
            return time.perf_counter() - started

    async def enqueue_batch(self, url: str, count: int, warm_up: bool = False) -> float:
        async with Queue.connect(url) as queue:
            await queue.store.ping()
            if warm_up:
                # (two jobs: one takes the one-job statement, and the batch's would stay unprepared)
                await queue.enqueue_many([JobSpec("noop", {"i": -1}), JobSpec("noop", {"i": -2})])
            started = time.perf_counter()
            for offset in range(0, count, 5000):
                await queue.enqueue_many([JobSpec("noop", {"i": i}) for i in range(offset, min(count, offset + 5000))])
            return time.perf_counter() - started

    def worker_command(self, url: str, mode: Mode) -> list[str]:
        module = "benchmarks.noop_worker" if mode == "drain" else "benchmarks.compare.systems.agora_latency_worker"
        return python_module_command("agora_pg.cli", "--log-level", "WARNING", "worker", "--module", module,
                                     "--concurrency", str(self.concurrency))

    def worker_env(self, url: str) -> dict[str, str]:
        return {"AGORA_PG_DATABASE_URL": url}

    @contextlib.asynccontextmanager
    async def latency_client(self, url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        async with Queue.connect(url) as queue:

            async def enqueue() -> None:
                await queue.enqueue("latency", latency_payload())

            yield enqueue

    async def done_count(self, url: str) -> int:
        # Completions of this drain (the grown-table workload preloads history a day old).
        return int(await _scalar(
            url,
            "SELECT count(*) FROM agora.runs WHERE status = 'succeeded' AND finished_at > now() - interval '1 hour'",
        ))

    async def completion_span_seconds(self, url: str) -> float:
        # Completions are written in batches that share one timestamp, so the span runs from
        # the first claim to the last completion: conservative (it includes the first batch).
        # Only this drain's runs count: the grown-table workload preloads history a day old.
        return float(await _scalar(
            url,
            "SELECT extract(epoch FROM max(finished_at) - min(started_at)) FROM agora.runs "
            "WHERE finished_at > now() - interval '1 hour'",
        ))


async def _scalar(url: str, sql: str) -> object:
    connection = await asyncpg.connect(Database(url).asyncpg_url)
    try:
        return await connection.fetchval(sql)
    finally:
        await connection.close()
