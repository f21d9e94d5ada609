"""PgQueuer 1.6.0, through its public API: ``Queries`` for install and enqueues,
``pgqueuer.run`` worker processes (see ``pgqueuer_worker``).

Completions come from ``pgqueuer_log``: PgQueuer appends a row with status
``'successful'`` when a job finishes. Its ``created`` column (timestamptz,
default ``now()``) is the start of the transaction that flushed the worker's
status buffer, which holds up to ``batch_size`` results or ~0.1 s; so completion
times are per flush (several jobs share one timestamp), not per job. The
``pgqueuer_statistics`` table is coarser still (per-second buckets, folded in
every ~30 s), so it is not used.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
from pgqueuer import Queries

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import Mode, System, latency_payload, python_module_command

# Jobs per dequeue (``pgq run --batch-size``; PgQueuer's default is 10). A 20,000-job drain stops
# gaining past 100 here. Its dequeue sorted every queued row (EXPLAIN), so deeper queues favour larger batches.
BATCH_SIZE = int(os.environ.get("BENCH_PGQUEUER_BATCH", "100"))
CHUNK = 5000


def _payload(index: int) -> bytes:
    return json.dumps({"i": index}).encode()


@contextlib.asynccontextmanager
async def _queries(url: str) -> AsyncIterator[Queries]:
    connection = await asyncpg.connect(Database(url).asyncpg_url)
    try:
        yield Queries.from_asyncpg_connection(connection)
    finally:
        await connection.close()


class PgQueuerSystem(System):
    key = "pgqueuer"
    name = "PgQueuer 1.6.0"

    def describe(self) -> str:
        return (f"pgqueuer.run (as `pgq run`), PgQueuer over one asyncpg connection, --batch-size {BATCH_SIZE}, "
                "async handlers, no max_concurrent_tasks, LISTEN/NOTIFY on, dequeue timeout 30 s, durable tables")

    async def setup(self, url: str) -> None:
        async with _queries(url) as queries:  # what `pgq install` runs (durability=durable)
            await queries.install()

    async def enqueue_one_by_one(self, url: str, count: int) -> float:
        async with _queries(url) as queries:
            started = time.perf_counter()
            for index in range(count):
                await queries.enqueue("noop", _payload(index))
            return time.perf_counter() - started

    async def enqueue_batch(self, url: str, count: int, warm_up: bool = False) -> float:
        async with _queries(url) as queries:
            if warm_up:
                await queries.enqueue(["noop"], [_payload(-1)], [0])
            started = time.perf_counter()
            for offset in range(0, count, CHUNK):
                size = min(count, offset + CHUNK) - offset
                await queries.enqueue(["noop"] * size, [_payload(offset + i) for i in range(size)], [0] * size)
            return time.perf_counter() - started

    def worker_command(self, url: str, mode: Mode) -> list[str]:
        return python_module_command("benchmarks.compare.systems.pgqueuer_worker", "--mode", mode)

    def worker_env(self, url: str) -> dict[str, str]:
        return {"BENCH_PGQUEUER_BATCH": str(BATCH_SIZE)}

    @contextlib.asynccontextmanager
    async def latency_client(self, url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
        async with _queries(url) as queries:

            async def enqueue() -> None:
                await queries.enqueue("latency", json.dumps(latency_payload()).encode())

            yield enqueue

    async def done_count(self, url: str) -> int:
        return int(await _successful(url, "count(*)"))

    async def completion_span_seconds(self, url: str) -> float:
        return await _successful(url, "extract(epoch FROM max(created) - min(created))")


async def _successful(url: str, aggregate: str) -> float:
    """``aggregate`` over the log rows of successfully completed jobs."""
    async with _queries(url) as queries:
        log = queries.qbe.settings.qualified.queue_table_log
        sql = f"SELECT ({aggregate})::float8 AS value FROM {log} WHERE status = 'successful'"
        rows = await queries.driver.fetch(sql)
    value = rows[0]["value"]
    assert isinstance(value, float), f"no successful job in {log}"
    return value
