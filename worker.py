"""The example worker module: ``agora-pg worker --module worker``.

This is the composition root: job handlers are registered in ``HANDLERS`` (plain
handlers, and job families from ``families/`` through a ``FamilyRegistry``) and on
the ``handlers`` table that extends it (kinds with options: a typed payload), the
resources they share are built once when the worker starts, and scheduled
pipelines are registered on the WorkerPool that ``get_worker()`` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from typing import Any

from datetime import UTC, datetime, timedelta

from agora_pg import Handlers, Job, Worker, job_context
from agora_pg.families import FamilyRegistry
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool
from families.appointment_reminder import register_appointment_reminder
from families.appointment_reminder.ports import Appointment, Message

log = logging.getLogger("worker")


@dataclasses.dataclass
class Resources:
    """Clients and services the handlers share (one instance per worker process)."""

    greeting: str
    appointments: dict[int, Appointment] = dataclasses.field(default_factory=dict)
    outbox: list[Message] = dataclasses.field(default_factory=list)


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


FAMILIES = register_appointment_reminder(FamilyRegistry())  # add families here

HANDLERS: dict[str, Any] = {
    "echo": echo,
    "sleep": sleep,
    "fail": fail,
    **FAMILIES.handlers(),  # appointment_reminder (variants: default = email, sms)
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
    """Open shared clients when the worker starts; close them when it stops."""
    tomorrow = datetime.now(UTC).replace(hour=9, minute=30, second=0, microsecond=0) + timedelta(days=1)
    appointments = {  # a real worker would open its appointment service's client here
        1: Appointment(1, "Ada Lovelace", "ada@example.com", tomorrow, "Marylebone Clinic", "Europe/London"),
        2: Appointment(2, "Alan Turing", "+44 20 7946 0000", tomorrow + timedelta(hours=2), "Bletchley Practice",
                       "Europe/London"),
    }
    yield Resources(greeting="hello from agora-pg", appointments=appointments)


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
