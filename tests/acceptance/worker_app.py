"""The worker module the acceptance tests start with `agora-pg worker --module worker_app`.

Every handler records the job in ``public.executions`` (job id primary key),
so a job that ran twice would fail on the second insert and show up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from agora_pg import Job, Worker

CREATE_EXECUTIONS = """
CREATE TABLE IF NOT EXISTS public.executions (
    job_id bigint PRIMARY KEY, attempt int NOT NULL, pid int NOT NULL
)
"""


async def _record(job: Job, pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO public.executions (job_id, attempt, pid) VALUES ($1, $2, $3)", job.id, job.attempt, os.getpid()
    )


async def record(job: Job, pool: asyncpg.Pool) -> None:
    await _record(job, pool)


async def slow(job: Job, pool: asyncpg.Pool) -> None:
    await asyncio.sleep(float(job.payload["seconds"]))
    await _record(job, pool)


async def hang_first_attempt(job: Job, pool: asyncpg.Pool) -> None:
    if job.attempt == 1:
        await asyncio.sleep(3600)
    await _record(job, pool)


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[Any]:
    pool = await asyncpg.create_pool(os.environ["AGORA_PG_DATABASE_URL"], min_size=0, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


def get_worker() -> Worker:
    return Worker({"record": record, "slow": slow, "hang_first_attempt": hang_first_attempt}, lifespan=lifespan)
