"""The example worker module: ``agora-pg worker --module worker``.

This is the composition root: handlers are registered in ``HANDLERS`` and the
resources they share are built once, when the worker starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from agora_pg import Job, Worker

log = logging.getLogger("worker")


@dataclasses.dataclass
class Resources:
    """Clients and services the handlers share (one instance per worker process)."""

    greeting: str


async def echo(job: Job, resources: Resources) -> None:
    """Log the payload: the smallest useful handler."""
    log.info("%s job %s: %s", resources.greeting, job.id, job.payload)


async def sleep(job: Job, resources: Resources) -> None:
    """Sleep ``payload["seconds"]`` (default 1): a slow job for trying shutdown."""
    await asyncio.sleep(float(job.payload.get("seconds", 1)))


def fail(job: Job, resources: Resources) -> None:
    """Always raise: shows retries and ``error_message`` (a sync handler, run in a thread)."""
    raise RuntimeError(job.payload.get("message", "this job always fails"))


HANDLERS: dict[str, Any] = {
    "echo": echo,
    "sleep": sleep,
    "fail": fail,
    # add yours here
}


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[Resources]:
    """Open shared clients when the worker starts; close them when it stops."""
    yield Resources(greeting="hello from agora-pg")


def get_worker() -> Worker:
    return Worker(HANDLERS, lifespan=lifespan)
