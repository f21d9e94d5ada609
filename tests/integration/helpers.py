"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import contextlib
import linecache
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from agora_pg.db.job_rows import JobFinish
from agora_pg.db.store import Store
from agora_pg.jobs import Job
from agora_pg.settings import Settings
from agora_pg.worker import Worker


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 30.0, interval: float = 0.05,
                     what: str | None = None) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds with a
    message naming what was awaited (``what``, else the predicate's source line)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not met within {timeout}s: {what or described(predicate)}")
        await asyncio.sleep(interval)


def described(function: Callable[..., object]) -> str:
    """Where ``function`` is written and its first line (a lambda's is the call it sits in)."""
    code = getattr(function, "__code__", None)
    if code is None:
        return repr(function)
    try:
        line = linecache.getline(code.co_filename, code.co_firstlineno).strip()
    except OSError:  # pragma: no cover - a file gone since
        line = ""
    return f"{Path(code.co_filename).name}:{code.co_firstlineno}: {line or function.__qualname__}"


@contextlib.asynccontextmanager
async def running(worker: Worker, stop_timeout: float = 20.0) -> AsyncIterator[asyncio.Task[None]]:
    """Run ``worker`` in a task for the block; stop it and wait for it after."""
    task = asyncio.create_task(worker.run(handle_signals=False))
    try:
        yield task
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_timeout)


async def record_failure(
    store: Store, job_id: int, attempt: int, worker_id: str, message: str, error_type: str = "ValueError",
    delay: float = 0.0,
) -> set[int]:
    """Record a failed attempt as a worker's completer does (retried after ``delay``)."""
    finish = JobFinish(job_id, attempt, "failed", error_type, message, None, delay, False)
    return await store.jobs.finish([finish], worker_id, max_lost_attempts=3, default_max_retries=3)


@contextlib.asynccontextmanager
async def serving(worker: Worker, store: Store, settings: Settings, stop_timeout: float = 20.0) -> AsyncIterator[None]:
    """Serve ``worker`` on the test's own ``store`` (so that a test can tamper with it)."""
    task = asyncio.create_task(worker.serve(store, settings))
    try:
        yield
    finally:
        worker.stop()
        await asyncio.wait_for(task, stop_timeout)


async def drain_by_claimers(
    store: Store, total: int, claim: Callable[[Store, str], Awaitable[list[Job]]],
    after_claim: Callable[[Store], Awaitable[None]], *, claimers: int = 6, seconds: float = 60,
) -> int:
    """Claim at once from ``claimers`` stores of their own (``claim(store, worker_id)``),
    each finishing what it claimed a moment later, until ``total`` jobs are done or
    ``seconds`` passed; ``after_claim`` samples the database after each claim. Returns
    how many jobs were done. (Not a number of claims: most come back empty while others
    hold the limit, and a busy machine spends more of them so.)"""
    stores = [Store.open(store.database) for _ in range(claimers)]
    done = 0

    async def work(own: Store, worker: str) -> None:
        nonlocal done
        while done < total:
            jobs = await claim(own, worker)
            await after_claim(own)
            if jobs:
                await asyncio.sleep(0.001)
                await own.jobs.complete_succeeded([(job.id, job.attempt) for job in jobs], worker)
                done += len(jobs)

    try:
        await asyncio.wait_for(asyncio.gather(*(work(own, f"w{n}") for n, own in enumerate(stores))), seconds)
    except TimeoutError:
        pass  # (the caller compares what was done with what it expected)
    finally:
        for own in stores:
            await own.close()
    return done
