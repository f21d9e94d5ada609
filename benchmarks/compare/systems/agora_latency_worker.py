"""agora-pg worker module whose handler records enqueue-to-start latency."""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator

import asyncpg

from agora_pg import Job, Worker
from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import record_latency


async def latency(job: Job, connection: asyncpg.Connection) -> None:
    await record_latency(connection, job.payload)


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(Database(os.environ["AGORA_PG_DATABASE_URL"]).asyncpg_url)
    try:
        yield connection
    finally:
        await connection.close()


def get_worker() -> Worker:
    return Worker({"latency": latency}, lifespan=lifespan)
