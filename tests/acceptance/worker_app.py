"""The worker module the acceptance tests start with `agora-pg worker --module worker_app`.

Most handlers record the job in ``public.executions`` (job id primary key), so a
job that ran twice would fail on the second insert and show up. The failure-path
handlers write a ledger instead: one file per process in ``$LEDGER_DIR``, a line
per event (start, end, stopped) with its time, so duplicates stay visible and
executions are recorded even while the database is away.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from agora_pg import Fail, Job, Worker

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


async def tally(job: Job, pool: asyncpg.Pool) -> None:
    """Record the job's latest execution (a run again after a kill overwrites it)."""
    await pool.execute(
        "INSERT INTO public.executions (job_id, attempt, pid) VALUES ($1, $2, $3) "
        "ON CONFLICT (job_id) DO UPDATE SET attempt = EXCLUDED.attempt, pid = EXCLUDED.pid",
        job.id, job.attempt, os.getpid(),
    )


async def slow(job: Job, pool: asyncpg.Pool) -> None:
    await asyncio.sleep(float(job.payload["seconds"]))
    await _record(job, pool)


async def hang_first_attempt(job: Job, pool: asyncpg.Pool) -> None:
    if job.attempt == 1:
        await asyncio.sleep(3600)
    await _record(job, pool)


def _ledger(job: Job, event: str) -> None:
    """Append ``job attempt pid event time`` to this process's ledger file in $LEDGER_DIR: a
    ledger that needs no database, so it records executions while the database is away."""
    path = os.path.join(os.environ["LEDGER_DIR"], f"{os.getpid()}.log")
    with open(path, "a") as ledger_file:
        ledger_file.write(f"{job.id} {job.attempt} {os.getpid()} {event} {time.time():.6f}\n")


async def ledger(job: Job, pool: asyncpg.Pool) -> None:
    """Record the execution's start, take ``seconds``, record its end (or that it was stopped)."""
    _ledger(job, "start")
    try:
        await asyncio.sleep(float(job.payload.get("seconds", 0)))
    except asyncio.CancelledError:
        _ledger(job, "stopped")
        raise
    _ledger(job, "end")


async def exit_process(job: Job, pool: asyncpg.Pool) -> None:
    """Kill the worker process (as running out of memory would)."""
    _ledger(job, "start")
    os._exit(int(job.payload.get("code", 9)))


async def block_loop(job: Job, pool: asyncpg.Pool) -> None:
    """An async handler that blocks the event loop with time.sleep."""
    _ledger(job, "start")
    time.sleep(float(job.payload["seconds"]))
    _ledger(job, "end")


def sync_sleep(job: Job, pool: asyncpg.Pool) -> None:
    """A sync handler (run in a thread) that takes ``seconds`` (``first_seconds`` at its
    first attempt, when given)."""
    _ledger(job, "start")
    time.sleep(float(job.payload.get("first_seconds" if job.attempt == 1 else "seconds", job.payload["seconds"])))
    _ledger(job, "end")


async def refuse(job: Job, pool: asyncpg.Pool) -> None:
    """Fails for good at once, whatever max_retries allows."""
    raise Fail(f"card {job.payload.get('card', '?')} declined")


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
        "exit_process": exit_process, "block_loop": block_loop, "sync_sleep": sync_sleep, "refuse": refuse,
        "tally_a": tally, "tally_b": tally,
    }
    if only := os.environ.get("WORKER_APP_KINDS"):  # a worker of these kinds only
        handlers = {kind: handlers[kind] for kind in only.split(",")}
    return Worker(handlers, lifespan=lifespan)
