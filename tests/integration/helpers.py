"""Small helpers shared by the integration tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

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
