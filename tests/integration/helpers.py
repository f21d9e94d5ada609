"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

from agora_pg.db.job_rows import JobFinish
from agora_pg.db.store import Store
from agora_pg.settings import Settings
from agora_pg.worker import Worker


async def wait_until(predicate: Callable[[], Awaitable[bool]], timeout: float = 10.0, interval: float = 0.05) -> None:
    """Poll ``predicate`` until it is true; fail the test after ``timeout`` seconds."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not await predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        await asyncio.sleep(interval)


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
