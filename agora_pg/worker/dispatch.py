"""Running one handler: async handlers are awaited, sync ones run in a thread."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agora_pg.errors import AgoraError
from agora_pg.jobs import Job

Handler = Callable[[Job, Any], Awaitable[Any] | Any]


class UnknownJobKind(AgoraError):
    """No handler is registered for a job's kind; the attempt fails."""

    def __init__(self, kind: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"no handler registered for kind {kind!r} (this worker handles: {listed})")
        self.kind = kind


def is_async_handler(handler: Handler) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


async def run_handler(handlers: Mapping[str, Handler], job: Job, resources: Any) -> None:
    """Run ``handlers[job.kind](job, resources)``; raises what the handler raises."""
    handler = handlers.get(job.kind)
    if handler is None:
        raise UnknownJobKind(job.kind, list(handlers))
    if is_async_handler(handler):
        await handler(job, resources)
    else:
        result = await asyncio.to_thread(handler, job, resources)
        if inspect.isawaitable(result):  # a sync function that returned a coroutine
            await result
