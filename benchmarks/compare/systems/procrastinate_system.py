"""Procrastinate 3.10.0, through its public API: ``Task.defer_async`` / ``Task.batch_defer_async``
for enqueues, ``App.run_worker_async`` worker processes (see ``procrastinate_worker``).

Completions are read from Procrastinate's own tables: ``procrastinate_jobs.status = 'succeeded'``
and ``procrastinate_events.at`` of the 'succeeded' events (set to ``now()`` by its status trigger
in the transaction that finishes the job).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import asyncpg
from procrastinate.types import JSONDict

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import Mode, System, latency_payload, python_module_command
from benchmarks.compare.systems.procrastinate_worker import concurrency, make_app

BATCH_SIZE = 5000


class ProcrastinateSystem(System):
    key = "procrastinate"
    name = "Procrastinate 3.10.0"

    def describe(self) -> str:
        workers = concurrency()
        return (f"run_worker_async(concurrency={workers}), psycopg pool max_size {workers + 1}, "
                f"LISTEN/NOTIFY on, poll 5 s; batch_defer_async in chunks of {BATCH_SIZE}")

    async def setup(self, url: str) -> None:
        bench = make_app(url, pool_size=1)
        async with bench.app.open_async():
            await bench.app.schema_manager.apply_schema_async()

    async def enqueue_one_by_one(self, url: str, count: int) -> float:
        bench = make_app(url, pool_size=1)
        async with bench.app.open_async():
            started = time.perf_counter()
            for index in range(count):
                await bench.noop.defer_async(i=index)
            return time.perf_counter() - started

    async def enqueue_batch(self, url: str, count: int, warm_up: bool = False) -> float:
        bench = make_app(url, pool_size=1)
        async with bench.app.open_async():
            if warm_up:
                await bench.noop.batch_defer_async({"i": -1})
            started = time.perf_counter()
            for offset in range(0, count, BATCH_SIZE):
                chunk: list[JSONDict] = [{"i": i} for i in range(offset, min(count, offset + BATCH_SIZE))]
                await bench.noop.batch_defer_async(*chunk)
            return time.perf_counter() - started

    def worker_command(self, url: str, mode: Mode) -> list[str]:
        return python_module_command("benchmarks.compare.systems.procrastinate_worker", "--mode", mode)

    def worker_env(self, url: str) -> dict[str, str]:
        return {"BENCH_PROCRASTINATE_CONCURRENCY": str(concurrency())}  # what describe() states

    @contextlib.asynccontextmanager
    async def latency_client(self, url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        bench = make_app(url, pool_size=1)
        async with bench.app.open_async():

            async def enqueue() -> None:
                await bench.latency.defer_async(**latency_payload())

            yield enqueue

    async def done_count(self, url: str) -> int:
        return int(await _scalar(url, "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"))

    async def completion_span_seconds(self, url: str) -> float:
        return float(await _scalar(url, "SELECT extract(epoch FROM max(at) - min(at)) FROM procrastinate_events "
                                        "WHERE type = 'succeeded'"))


async def _scalar(url: str, sql: str) -> Any:
    connection = await asyncpg.connect(Database(url).asyncpg_url)
    try:
        return await connection.fetchval(sql)
    finally:
        await connection.close()
