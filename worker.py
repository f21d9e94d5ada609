"""The example worker module: ``agora-pg worker --module worker``.

Job handlers are registered in ``HANDLERS`` (plain handlers, and the job families of
``families/``, which register themselves in ``families.shared.registry`` when imported)
and on the ``handlers`` table that extends it (kinds with options: a typed payload);
they run on the services of the composition root (``init.init()``), built once when
the worker starts; scheduled pipelines are registered on the WorkerPool that
``get_worker()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

import families.appointment_reminder.impl  # noqa: F401 (registers the family)
from agora_pg import Handlers, Job, Worker, job_context
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool
from families.shared.registry import FAMILIES
from init import Services as Resources
from init import init

log = logging.getLogger("worker")


async def echo(job: Job, resources: Resources) -> None:
    """Log the payload: the smallest useful handler."""
    log.info("%s job %s: %s", resources.greeting, job.id, job.payload)


async def sleep(job: Job, resources: Resources) -> None:
    """Sleep ``payload["seconds"]`` (default 1), reporting progress ten times: a slow job
    for trying shutdown, and for watching progress bars move."""
    seconds = float(job.payload.get("seconds", 1))
    context = job_context()
    for step in range(1, 11):
        await asyncio.sleep(seconds / 10)
        await context.progress(step, 10, f"slept {seconds * step / 10:g} of {seconds:g} s")


def fail(job: Job, resources: Resources) -> None:
    """Always raise: shows retries and ``error_message`` (a sync handler, run in a thread)."""
    raise RuntimeError(job.payload.get("message", "this job always fails"))


HANDLERS: dict[str, Any] = {
    "echo": echo,
    "sleep": sleep,
    "fail": fail,
    **FAMILIES.handlers(),  # appointment_reminder (variants: email, the default, and sms)
    # add yours here
}

# The seed's table, plus kinds registered with options by a decorator.
handlers = Handlers(HANDLERS)


@dataclasses.dataclass
class Terms:
    """A typed payload: POST /jobs checks it (a 400 naming the field), the handler gets a Terms."""

    a: float
    b: float


@handlers.kind("add", payload=Terms, max_retries=0, timeout=5)
async def add(job: Job, resources: Resources) -> float:
    """Return the sum: the job's result (GET /jobs/{id}, ``await queue.wait(job.id)``)."""
    terms: Terms = job.payload
    return terms.a + terms.b


@contextlib.asynccontextmanager
async def lifespan() -> AsyncIterator[Resources]:
    """The composition root's services when the worker starts (closed when it stops)."""
    yield init()


class Heartbeat:
    """A tiny pipeline: anything with an async ``run()`` (and optionally ``close()``)."""

    async def run(self) -> None:
        log.info("scheduled pipeline 'heartbeat' ran")


async def build_heartbeat() -> Heartbeat:
    """The factory: called fresh before every run, so no state leaks between runs."""
    return Heartbeat()


def get_worker() -> WorkerPool:
    pool = WorkerPool(health_port=8080, graceful_shutdown_timeout=30.0)
    pool.register(Worker(handlers, lifespan=lifespan))
    pool.register(
        ScheduledPipeline(
            factory=build_heartbeat,
            schedule=Schedule.every(minutes=1),
            pipeline_id="heartbeat",
        )
    )
    return pool
