"""The interface every compared system implements, and what they share.

A system is driven only through its public API. The harness:
- calls ``setup(url)`` on an empty database;
- times ``enqueue_one_by_one`` / ``enqueue_batch`` (each returns elapsed seconds; a timed
  batch enqueue warms its connection up first);
- for drains, enqueues with ``enqueue_batch`` (untimed), starts ``processes`` copies of
  ``worker_command(url, "drain")`` (cwd = repository root), polls ``done_count`` until all
  jobs are done, then asks ``completion_span_seconds`` for the time from the first to the
  last completion as the system itself recorded it in the database;
- for wake-up latency, starts one ``worker_command(url, "latency")``, waits until it is idle,
  opens ``latency_client(url)`` and calls the function it yields about 20 times a second;
  each call enqueues one job whose payload is ``latency_payload()``, made right before the
  system's enqueue call. The latency handler
  inserts ``(time.time() - payload["sent_at"]) * 1000`` into ``public.bench_latency``
  (see ``record_latency``), so enqueue-to-handler-start is measured on one clock.
"""

from __future__ import annotations

import abc
import asyncio
import sys
import time
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal

import asyncpg

Mode = Literal["drain", "latency"]

CREATE_LATENCY_TABLE = """
CREATE TABLE IF NOT EXISTS public.bench_latency (id bigserial PRIMARY KEY, latency_ms double precision NOT NULL)
"""


def latency_payload() -> dict[str, Any]:
    """The payload of a latency job: when it was sent (wall clock, seconds)."""
    return {"sent_at": time.time()}


_RECORD_LOCKS: dict[int, asyncio.Lock] = {}  # id of a worker's recording connection: its lock


async def record_latency(connection: asyncpg.Connection, payload: dict[str, Any]) -> None:
    """Called first thing in a latency handler. The latency is taken before anything is
    awaited; then the inserts of handlers running at once take turns on the worker's one
    recording connection (asyncpg runs one operation at a time on a connection: two
    overlapping handlers failed with "another operation is in progress")."""
    latency_ms = (time.time() - float(payload["sent_at"])) * 1000.0
    async with _RECORD_LOCKS.setdefault(id(connection), asyncio.Lock()):
        await connection.execute("INSERT INTO public.bench_latency (latency_ms) VALUES ($1)", latency_ms)


class System(abc.ABC):
    """A job system under test."""

    key: str  # short id used in file names and worker module paths
    name: str  # name and version shown in the table

    @abc.abstractmethod
    def describe(self) -> str:
        """The settings used (concurrency, batch size...), stated in the output."""

    @abc.abstractmethod
    async def setup(self, url: str) -> None:
        """Create the system's schema in an empty database."""

    @abc.abstractmethod
    async def enqueue_one_by_one(self, url: str, count: int) -> float:
        """Enqueue ``count`` no-op jobs with one API call (and one commit) each; seconds taken."""

    @abc.abstractmethod
    async def enqueue_batch(self, url: str, count: int, warm_up: bool = False) -> float:
        """Enqueue ``count`` no-op jobs through the system's batch API; seconds taken. With
        ``warm_up``, one batch of one job goes first, untimed, on the same connection (the
        first call on a fresh connection prepares its statements and is 40-60 % slower)."""

    @abc.abstractmethod
    def worker_command(self, url: str, mode: Mode) -> list[str]:
        """The argv of one worker process: no-op handler ("drain") or latency-recording handler."""

    def worker_env(self, url: str) -> dict[str, str]:
        """Environment variables a worker process needs besides the harness's own (which
        always include ``BENCH_DATABASE_URL=url``)."""
        return {}

    @abc.abstractmethod
    def latency_client(self, url: str) -> AbstractAsyncContextManager[Callable[[], Awaitable[None]]]:
        """An open client; the function it yields enqueues one latency job."""

    @abc.abstractmethod
    async def done_count(self, url: str) -> int:
        """How many jobs have completed successfully."""

    @abc.abstractmethod
    async def completion_span_seconds(self, url: str) -> float:
        """Seconds from the first to the last completion, as recorded in the database."""


def python_module_command(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]
