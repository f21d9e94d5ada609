"""The client side: enqueue, look up and cancel jobs."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Iterable
from datetime import UTC, datetime
from typing import Any

from agora_pg.db.connect import Database, resolve_database
from agora_pg.db.enqueue import CallerConnection
from agora_pg.db.store import Store
from agora_pg.events.model import Event, EventFilter, parse_cursor
from agora_pg.events.stream import EventStream
from agora_pg.job_spec import JobSpec
from agora_pg.errors import JobFailed
from agora_pg.jobs import Job, JobStatus
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.handlers import apply_kinds, kind_table


class Queue:
    """Enqueue jobs into ``agora.jobs``.

    >>> async with Queue.connect() as queue:          # DATABASE_URL or embedded
    ...     job = await queue.enqueue("send_email", payload={"to": "a@b.c"})
    """

    def __init__(self, store: Store, settings: Settings | None = None, handlers: Any = None) -> None:
        self.store = store
        self.settings = settings if settings is not None else Settings()
        self.kinds = kind_table(handlers)

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(
        cls, database_url: str | None = None, settings: Settings | None = None, *, handlers: Any = None
    ) -> AsyncIterator[Queue]:
        """A queue on ``database_url``, else on the settings' database (from the
        environment by default), else on the embedded server. With ``handlers`` (a
        ``Handlers`` table, or the ``Worker`` or ``WorkerPool`` of your worker module),
        each kind's payload type is checked and its queue and max_retries apply even
        before a worker of it has declared them; without, the options its workers
        declared (``agora.kinds``) apply all the same."""
        settings = settings if settings is not None else load_settings(os.environ)
        if database_url is not None:
            settings = settings.replace(database_url=database_url)
        async with resolve_database(settings) as database:
            store = Store.open(database)
            try:
                yield cls(store, settings, handlers)
            finally:
                await store.close()

    @classmethod
    def from_engine(cls, engine: Any, settings: Settings | None = None, *, handlers: Any = None) -> Queue:
        """A queue on an existing SQLAlchemy ``AsyncEngine`` (left open on exit)."""
        return cls(Store.from_engine(engine), settings, handlers)

    @property
    def database(self) -> Database:
        return self.store.database

    async def enqueue(
        self,
        kind: str,
        payload: Any = None,
        *,
        name: str | None = None,
        queue: str | None = None,
        priority: int = 0,
        run_at: datetime | None = None,
        max_retries: int | None = None,
        dedup_key: str | None = None,
        timeout_seconds: float | None = None,
        connection: CallerConnection | None = None,
    ) -> Job:
        """Store one job and return it. ``payload``: a dict, or a dataclass or
        ``msgspec.Struct`` instance; ``queue``: the kind's, else ``"default"``.

        With ``dedup_key``, a job with that key that is still pending,
        processing or waiting for a retry is returned instead of a new one.
        With ``connection`` (asyncpg, or SQLAlchemy ``AsyncConnection`` /
        ``AsyncSession``), the job commits or rolls back with the caller's
        transaction. ``timeout_seconds`` bounds each attempt (default: the kind's
        timeout, else the worker's ``WORKER_JOB_TIMEOUT``).
        """
        spec = JobSpec(kind, {} if payload is None else payload, name=name, queue=queue, priority=priority,
                       run_at=run_at, max_retries=max_retries, dedup_key=dedup_key, timeout_seconds=timeout_seconds)
        [(job, _created)] = await self.store.jobs.enqueue(apply_kinds(self.kinds, [spec]), connection)
        return job

    async def enqueue_many(
        self, specs: Iterable[JobSpec], *, connection: CallerConnection | None = None
    ) -> list[Job]:
        """Store many jobs in one statement; returns them in the order given."""
        results = await self.store.jobs.enqueue(apply_kinds(self.kinds, list(specs)), connection)
        return [job for job, _created in results]

    async def get(self, job_id: int) -> Job:
        """The job with this id (``JobNotFound`` otherwise)."""
        return await self.store.jobs.get(job_id)

    async def wait(self, job_id: int, *, timeout: float | None = None) -> Any:
        """Wait until the job has finished for good and return its result: what the handler
        of its succeeded attempt returned (JSON-decoded; None when it returned nothing).
        Raises ``JobFailed`` for a job that failed for good or was cancelled,
        ``TimeoutError`` after ``timeout`` seconds (the job is left as it is),
        ``JobNotFound`` for an unknown id.

        >>> job = await queue.enqueue("add", {"a": 1, "b": 2})
        >>> await queue.wait(job.id, timeout=30)
        3

        Follows the job's events (a LISTEN connection of its own while waiting)."""
        async with asyncio.timeout(timeout):
            job = await self.get(job_id)
            if not job.is_finished:
                async for event in self.events(job_id=job_id, since=job.created_at):
                    if event.type in ("job.finished", "job.cancelled"):
                        job = await self.get(job_id)
                        if job.is_finished:
                            break
            if job.status is not JobStatus.DONE:
                raise JobFailed(job.id, job.status.value, job.error_message)
            runs = await self.store.runs.of_job(job_id)
            return next((run.result for run in runs if run.status == "succeeded"), None)

    async def events(
        self,
        *,
        job_id: int | None = None,
        kind: str | None = None,
        queue: str | None = None,
        pipeline_id: str | None = None,
        since: datetime | str | None = None,
    ) -> AsyncIterator[Event]:
        """Job and pipeline events as they happen, from every worker process (filters
        combine). ``since`` (a time, or an event cursor) replays the state changes from
        then on first, so that waiting for a job cannot miss its end:

        >>> job = await queue.enqueue("report")
        >>> async for event in queue.events(job_id=job.id, since=job.created_at):
        ...     if event.type == "job.finished" and event.data["retry_at"] is None:
        ...         break

        Uses a LISTEN connection of its own while iterated."""
        start = None
        if isinstance(since, str):
            start = parse_cursor(since, datetime.now(UTC))
        elif since is not None:
            start = since
        stream = EventStream(self.store)
        try:
            subscription = await stream.subscribe(EventFilter(job_id, kind, queue, pipeline_id), start)
            async for event in subscription.events():
                yield event
        finally:
            await stream.close()

    async def cancel(self, job_id: int) -> Job:
        """Cancel a job: one that has not started at once; a running one is stopped by its
        worker (returned still processing, with ``cancel_requested_at`` set).
        ``InvalidTransition`` for a finished job."""
        return await self.store.jobs.cancel(job_id)
