"""The worker module the acceptance tests start with `agora-pg worker --module worker_app`.

Most handlers record the job in ``public.executions`` (job id primary key), so a
job that ran twice would fail on the second insert and show up. The failure-path
handlers write a ledger instead (``public.ledger``, no unique key: duplicates stay
visible), with the time each execution started and ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from agora_pg import Job, Worker

CREATE_EXECUTIONS = """
CREATE TABLE IF NOT EXISTS public.executions (
    job_id bigint PRIMARY KEY, attempt int NOT NULL, pid int NOT NULL
)
"""


CREATE_LEDGER = """
CREATE TABLE IF NOT EXISTS public.ledger (
    job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
    started_at timestamptz NOT NULL, finished_at timestamptz
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


async def _ledger_start(job: Job, pool: asyncpg.Pool) -> None:
    await pool.execute(
        "INSERT INTO public.ledger (job_id, attempt, pid, started_at) VALUES ($1, $2, $3, clock_timestamp())",
        job.id, job.attempt, os.getpid(),
    )


async def _ledger_end(job: Job, pool: asyncpg.Pool) -> None:
    await pool.execute(
        "UPDATE public.ledger SET finished_at = clock_timestamp() WHERE job_id = $1 AND attempt = $2 AND pid = $3",
        job.id, job.attempt, os.getpid(),
    )


async def ledger(job: Job, pool: asyncpg.Pool) -> None:
    """Record the execution, take ``seconds``, record its end."""
    await _ledger_start(job, pool)
    await asyncio.sleep(float(job.payload.get("seconds", 0)))
    await _ledger_end(job, pool)


async def exit_process(job: Job, pool: asyncpg.Pool) -> None:
    """Kill the worker process (as running out of memory would)."""
    await _ledger_start(job, pool)
    os._exit(int(job.payload.get("code", 9)))


async def block_loop(job: Job, pool: asyncpg.Pool) -> None:
    """An async handler that blocks the event loop with time.sleep."""
    await _ledger_start(job, pool)
    time.sleep(float(job.payload["seconds"]))
    await _ledger_end(job, pool)


def sync_sleep(job: Job, pool: asyncpg.Pool) -> None:
    """A sync handler (run in a thread) that takes ``seconds``; it writes its ledger rows
    through a connection of its own."""
    async def write(sql: str) -> None:
        connection = await asyncpg.connect(os.environ["AGORA_PG_DATABASE_URL"])
        try:
            await connection.execute(sql, job.id, job.attempt, os.getpid())
        finally:
            await connection.close()

    asyncio.run(write("INSERT INTO public.ledger (job_id, attempt, pid, started_at) "
                      "VALUES ($1, $2, $3, clock_timestamp())"))
    time.sleep(float(job.payload["seconds"]))
    asyncio.run(write("UPDATE public.ledger SET finished_at = clock_timestamp() "
                      "WHERE job_id = $1 AND attempt = $2 AND pid = $3"))


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[Any]:
    pool = await asyncpg.create_pool(os.environ["AGORA_PG_DATABASE_URL"], min_size=0, max_size=4)
    try:
        yield pool
    finally:
        await pool.close()


def get_worker() -> Worker:
    handlers = {
        "record": record, "slow": slow, "hang_first_attempt": hang_first_attempt, "ledger": ledger,
        "exit_process": exit_process, "block_loop": block_loop, "sync_sleep": sync_sleep,
    }
    return Worker(handlers, lifespan=lifespan)
