"""The worker module of the chaos scenarios: ``agora-pg worker --module tests.chaos.chaos_app``.

Every handler first appends ``job attempt pid time`` to this process's ledger file in
``$CHAOS_LEDGER_DIR`` (a file, so that an execution is recorded even while the
database is away; ``harness.load_ledger`` loads the files into ``public.chaos_ledger``,
a table with no unique constraint, where duplicates stay visible).
"""

from __future__ import annotations

import asyncio
import os
import time

from agora_pg import Handlers, Job, Worker

handlers = Handlers()
handlers.queue("limited", concurrency=90)  # (the limits_under_kills scenario's queue: below its keys' 50 x 2)


def record(job: Job) -> None:
    path = os.path.join(os.environ["CHAOS_LEDGER_DIR"], f"{os.getpid()}.ledger")
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(f"{job.id} {job.attempt} {os.getpid()} {time.time():.6f}\n")


@handlers.kind("work")
async def work(job: Job, resources: object) -> None:
    """An ordinary job: recorded, then ``seconds`` of (async) work."""
    record(job)
    await asyncio.sleep(float(job.payload.get("seconds", 0.0)))


@handlers.kind("limited", concurrency=2, limit_by="key")
async def limited(job: Job, resources: object) -> None:
    """An ordinary job of a kind limited to 2 running per payload ``key`` (in the queue
    ``limited``, limited to 90 running jobs): recorded when it
    starts and, in ``<pid>.ends``, when it ends (a kill leaves no end: the kill's time is)."""
    record(job)
    try:
        await asyncio.sleep(float(job.payload.get("seconds", 0.0)))
    finally:
        path = os.path.join(os.environ["CHAOS_LEDGER_DIR"], f"{os.getpid()}.ends")
        with open(path, "a", encoding="utf-8") as ends:
            ends.write(f"{job.id} {job.attempt} {os.getpid()} {time.time():.6f}\n")


@handlers.kind("beside")
async def beside(job: Job, resources: object) -> None:
    """A job of ``seconds`` that the bad_handlers scenario enqueues with the stuck sync one,
    to run beside it in the worker that then stops."""
    record(job)
    await asyncio.sleep(float(job.payload.get("seconds", 0.0)))


@handlers.kind("hang", timeout=1.0)
async def hang(job: Job, resources: object) -> None:
    """Never returns by itself: its kind's timeout ends each attempt."""
    record(job)
    await asyncio.sleep(3600)


@handlers.kind("hang_sync", timeout=1.0)
def hang_sync(job: Job, resources: object) -> None:
    """A sync handler that never returns: its thread is given up a lease after its
    timeout, and its worker stops to be restarted."""
    record(job)
    time.sleep(3600)


@handlers.kind("exit")
async def exit_process(job: Job, resources: object) -> None:
    """Kills its own process, as running out of memory would."""
    record(job)
    os._exit(9)


@handlers.kind("poison")
async def poison(job: Job, resources: object) -> None:
    """Raises an error whose text PostgreSQL cannot store as it is."""
    record(job)
    raise ValueError("bad \x00 text \ud800 " + "x" * 20_000)


def get_worker() -> Worker:
    return Worker(handlers)
