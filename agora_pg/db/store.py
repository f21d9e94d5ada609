"""The Store: the one class that talks to PostgreSQL.

It owns (or borrows) a SQLAlchemy async engine and runs the statements of
``agora_pg.db.queries`` on the engine's asyncpg connections. Nothing else in
agora-pg holds an engine, a pool or a connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, TypeAlias, cast

import asyncpg
import asyncpg.pool
import sqlalchemy.exc
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from agora_pg.db import queries
from agora_pg.db.connect import Database
from agora_pg.errors import DatabaseUnavailable, InvalidTransition, JobNotFound
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus
from agora_pg.db.schedule_rows import ClaimedRun, RunFinish, ScheduleRegistration, ScheduleRow

log = logging.getLogger("agora_pg.store")

NOTIFY_CHANNEL = "agora_jobs"

# What a caller may pass so that an enqueue joins its own transaction.
CallerConnection: TypeAlias = "asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | AsyncConnection | AsyncSession"

_CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    ConnectionError,
)


_STATUSES = {status.value: status for status in JobStatus}


def inserted_job(row: Mapping[str, Any], spec: JobSpec) -> Job:
    """The ``Job`` a spec became, from the ``queries.INSERTED_COLUMNS`` of its row."""
    return Job(
        id=row["id"],
        name=spec.name if spec.name is not None else spec.kind,
        kind=spec.kind,
        queue=spec.queue,
        status=JobStatus.PENDING,
        payload=spec.payload,
        priority=spec.priority,
        run_at=row["run_at"],
        retry_count=0,
        max_retries=spec.max_retries,
        error_message=None,
        dedup_key=spec.dedup_key,
        created_at=row["created_at"],
        started_at=None,
        finished_at=None,
        locked_by=None,
        lease_expires_at=None,
        attempt=0,
    )


def row_to_job(row: Mapping[str, Any]) -> Job:
    """Build a ``Job`` from a row selected with ``queries.JOB_COLUMNS``."""
    return Job(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        queue=row["queue"],
        status=_STATUSES[row["status"]],
        payload=json.loads(row["payload"]),
        priority=row["priority"],
        run_at=row["run_at"],
        retry_count=row["retry_count"],
        max_retries=row["max_retries"],
        error_message=row["error_message"],
        dedup_key=row["dedup_key"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        locked_by=row["locked_by"],
        lease_expires_at=row["lease_expires_at"],
        attempt=row["attempt"],
    )


class CannotConnect(ConnectionError):
    """The server refused a new connection (counted as a connection error)."""


class IdleConnections:
    """The Store's own asyncpg connections: a LIFO list of idle ones, at most
    ``limit`` in use at once.

    Taking and returning a connection are list operations: no ping and no reset
    query, which in SQLAlchemy's pool (and asyncpg's) cost a round trip or a
    greenlet hop per call, half the time of a single enqueue. A connection that
    broke, or was left inside a transaction, is closed instead of reused; a broken
    one also empties the idle list, since a server restart kills them all.
    """

    def __init__(self, url: str, limit: int) -> None:
        self._url = url
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self._closed = False

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._slots:
            connection = await self._take()
            try:
                yield connection
            except _CONNECTION_ERRORS:
                connection.terminate()
                self._drop_idle()
                raise
            except Exception:
                self._give_back(connection)  # a query failed; the connection is fine
                raise
            except BaseException:
                connection.terminate()  # cancelled mid-query: its protocol state is unknown
                raise
            else:
                self._give_back(connection)

    async def _take(self) -> asyncpg.Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.is_closed():
                return connection
        try:
            return await asyncpg.connect(self._url)
        except asyncpg.PostgresError as error:  # refused by the server: no such database, auth...
            raise CannotConnect(str(error)) from error

    def _give_back(self, connection: asyncpg.Connection) -> None:
        if self._closed or connection.is_closed() or connection.is_in_transaction():
            connection.terminate()
        else:
            self._idle.append(connection)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.terminate()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=5)


class Store:
    """Job-queue operations on one database."""

    def __init__(
        self, engine: AsyncEngine, database: Database, *, owns_engine: bool = False, pool_size: int = 5
    ) -> None:
        self._engine = engine
        self.database = database
        self._owns_engine = owns_engine
        # Statements of the Store run on its own connections; a borrowed engine's pool
        # is used only when the caller gave one (it may limit connections on purpose).
        self._own = IdleConnections(database.asyncpg_url, 2 * pool_size) if owns_engine else None

    @classmethod
    def open(cls, database: Database, *, pool_size: int = 5) -> Store:
        """A Store with its own engine and connections (closed by ``close()``)."""
        return cls(database.create_engine(pool_size=pool_size), database, owns_engine=True, pool_size=pool_size)

    @classmethod
    def from_engine(cls, engine: AsyncEngine) -> Store:
        """A Store on the caller's engine (``close()`` leaves it open)."""
        url = engine.url.render_as_string(hide_password=False)
        return cls(engine, Database(url), owns_engine=False)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def close(self) -> None:
        if self._own is not None:
            await self._own.close()
        if self._owns_engine:
            await self._engine.dispose()

    @contextlib.asynccontextmanager
    async def _sa_connection(self) -> AsyncIterator[AsyncConnection]:
        sa_connection = self._engine.connect()
        try:
            await sa_connection.start()
        except (sqlalchemy.exc.DBAPIError, *_CONNECTION_ERRORS) as error:
            raise self._unavailable(error) from error
        try:
            yield sa_connection
        except _CONNECTION_ERRORS as error:
            # The server restarted or the network broke: every pooled connection is
            # likely dead too, so drop them all rather than fail once per connection.
            await sa_connection.invalidate()
            await self._engine.dispose(close=False)
            raise self._unavailable(error) from error
        finally:
            await sa_connection.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """An asyncpg connection; connection errors become ``DatabaseUnavailable``
        and the broken connection is discarded."""
        if self._own is None:
            async with self._sa_connection() as sa_connection:
                raw = await sa_connection.get_raw_connection()
                yield raw.driver_connection
            return
        try:
            async with self._own.acquire() as connection:
                yield connection
        except _CONNECTION_ERRORS as error:
            raise self._unavailable(error) from error

    async def run_sync_in_transaction(self, function: Callable[[SyncConnection], None]) -> None:
        """Run ``function(connection)`` (synchronous SQLAlchemy code such as
        Alembic) in one transaction, committed if it returns."""
        async with self._sa_connection() as sa_connection:
            async with sa_connection.begin():
                await sa_connection.run_sync(function)

    def _unavailable(self, error: BaseException) -> DatabaseUnavailable:
        reason = error.orig if isinstance(error, sqlalchemy.exc.DBAPIError) and error.orig else error
        return DatabaseUnavailable(f"cannot use the database at {self.database.display_url}: {reason}")

    async def _fetch(self, sql: str, *args: Any) -> list[asyncpg.Record]:
        async with self.connection() as connection:
            return cast(list[asyncpg.Record], await connection.fetch(sql, *args))

    # -- schema -----------------------------------------------------------------

    async def schema_versions(self) -> set[str]:
        """Applied Alembic revisions; empty when the schema was never migrated."""
        async with self.connection() as connection:
            if not await connection.fetchval(queries.VERSION_TABLE_EXISTS):
                return set()
            return {row["version_num"] for row in await connection.fetch(queries.SELECT_SCHEMA_VERSIONS)}

    # -- enqueue ----------------------------------------------------------------

    async def enqueue(
        self, specs: Sequence[JobSpec], connection: CallerConnection | None = None
    ) -> list[tuple[Job, bool]]:
        """Insert jobs; returns each job with ``True`` if it was inserted or
        ``False`` if a live job with its dedup_key was returned instead."""
        if not specs:
            return []
        if connection is not None:
            return await _enqueue(_caller_fetch(connection), specs)
        async with self.connection() as own:
            return await _enqueue(own.fetch, specs)

    # -- reading and cancelling --------------------------------------------------

    async def get_job(self, job_id: int) -> Job:
        rows = await self._fetch(queries.SELECT_JOB, job_id)
        if not rows:
            raise JobNotFound(job_id)
        return row_to_job(rows[0])

    async def cancel_job(self, job_id: int) -> Job:
        """Cancel a job that has not started yet."""
        rows = await self._fetch(queries.CANCEL_JOB, job_id)
        if rows:
            return row_to_job(rows[0])
        job = await self.get_job(job_id)
        raise InvalidTransition(job_id, job.status.value, JobStatus.CANCELLED.value)

    # -- claiming and finishing ---------------------------------------------------

    async def claim_jobs(
        self, queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float
    ) -> list[Job]:
        """Claim up to ``limit`` due jobs, highest priority first."""
        if len(queues) == 1:
            rows = await self._fetch(queries.CLAIM_JOBS, queues[0], limit, worker_id, float(lease_seconds))
        else:
            rows = await self._fetch(
                queries.CLAIM_JOBS_FROM_QUEUES, list(queues), limit, worker_id, float(lease_seconds)
            )
        jobs = [row_to_job(row) for row in rows]
        jobs.sort(key=lambda job: (-job.priority, job.run_at, job.id))
        return jobs

    async def complete_succeeded(self, attempts: Sequence[tuple[int, int]], worker_id: str) -> set[int]:
        """Mark ``(job_id, attempt)`` pairs done; returns the ids that were still held."""
        rows = await self._fetch(
            queries.COMPLETE_SUCCEEDED, [a[0] for a in attempts], [a[1] for a in attempts], worker_id
        )
        return {row["job_id"] for row in rows}

    async def complete_failed(
        self,
        failures: Sequence[tuple[int, int, str, str, float]],
        worker_id: str,
        default_max_retries: int,
    ) -> set[int]:
        """Record failed attempts ``(job_id, attempt, error_type, error_message, delay)``."""
        columns = list(zip(*failures, strict=True))
        rows = await self._fetch(
            queries.COMPLETE_FAILED,
            list(columns[0]),
            list(columns[1]),
            list(columns[2]),
            list(columns[3]),
            [float(delay) for delay in columns[4]],
            default_max_retries,
            worker_id,
        )
        return {row["job_id"] for row in rows}

    async def release_jobs(self, attempts: Sequence[tuple[int, int]], worker_id: str) -> set[int]:
        """Give unfinished attempts back as pending, without counting an attempt."""
        rows = await self._fetch(
            queries.RELEASE_JOBS, [a[0] for a in attempts], [a[1] for a in attempts], worker_id
        )
        return {row["id"] for row in rows}

    async def rescue_expired(self, default_max_retries: int, limit: int) -> list[int]:
        """Take back processing jobs whose lease expired; returns their ids."""
        rows = await self._fetch(queries.RESCUE_EXPIRED, default_max_retries, limit)
        return [row["id"] for row in rows]

    # -- workers -------------------------------------------------------------------

    async def register_worker(self, worker_id: str, hostname: str, pid: int, queues: Sequence[str]) -> None:
        async with self.connection() as connection:
            await connection.execute(queries.INSERT_WORKER, worker_id, hostname, pid, list(queues))

    async def heartbeat(self, worker_id: str, lease_seconds: float) -> None:
        async with self.connection() as connection:
            await connection.execute(queries.HEARTBEAT, worker_id, float(lease_seconds))

    async def stop_worker(self, worker_id: str) -> None:
        async with self.connection() as connection:
            await connection.execute(queries.STOP_WORKER, worker_id)

    async def delete_stale_workers(self, older_than_seconds: float) -> None:
        async with self.connection() as connection:
            await connection.execute(queries.DELETE_STALE_WORKERS, float(older_than_seconds))

    # -- schedules -------------------------------------------------------------------

    async def upsert_schedule(self, registration: ScheduleRegistration) -> ScheduleRow:
        rows = await self._fetch(
            queries.UPSERT_SCHEDULE,
            registration.pipeline_id,
            registration.kind,
            registration.spec,
            registration.first_run_at,
            registration.error_backoff_seconds,
            registration.max_consecutive_errors,
        )
        return ScheduleRow.from_row(rows[0])

    async def get_schedule(self, pipeline_id: str) -> ScheduleRow | None:
        rows = await self._fetch(queries.SELECT_SCHEDULE, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def claim_pipeline_run(
        self, pipeline_id: str, spec: str, worker_id: str, lease_seconds: float
    ) -> ClaimedRun | None:
        """Claim the pipeline's due run, or None when it is not due, leased or not ours."""
        rows = await self._fetch(queries.CLAIM_PIPELINE_RUN, pipeline_id, worker_id, spec, float(lease_seconds))
        if not rows:
            return None
        row = rows[0]
        return ClaimedRun(ScheduleRow.from_row(row), run_id=row["run_id"], scheduled_for=row["scheduled_for"])

    async def renew_pipeline_lease(self, pipeline_id: str, worker_id: str, lease_seconds: float) -> None:
        async with self.connection() as connection:
            await connection.execute(queries.RENEW_PIPELINE_LEASE, pipeline_id, worker_id, float(lease_seconds))

    async def finish_pipeline_run(self, finish: RunFinish) -> bool:
        """Record a run's end; False if this worker no longer held the lease."""
        rows = await self._fetch(
            queries.FINISH_PIPELINE_RUN,
            finish.pipeline_id,
            finish.worker_id,
            finish.run_id,
            finish.status,
            finish.error_type,
            finish.error_message,
            finish.consecutive_errors,
            finish.next_run_at,
            finish.state,
        )
        return bool(rows)

    async def release_pipeline_run(self, pipeline_id: str, worker_id: str, run_id: int) -> bool:
        rows = await self._fetch(queries.RELEASE_PIPELINE_RUN, pipeline_id, worker_id, run_id)
        return bool(rows)

    async def ping(self) -> None:
        async with self.connection() as connection:
            await connection.fetchval(queries.PING)

    # -- notifications -------------------------------------------------------------

    async def listen(self, on_queue: Callable[[str], None]) -> ListenConnection:
        """A dedicated connection that calls ``on_queue(queue)`` for every enqueue."""
        try:
            connection = await asyncpg.connect(self.database.asyncpg_url)
        except _CONNECTION_ERRORS as error:
            raise DatabaseUnavailable(f"database unavailable: {error}") from error
        listen = ListenConnection(connection)

        def callback(_connection: object, _pid: int, _channel: str, payload: str) -> None:
            on_queue(payload)

        await connection.add_listener(NOTIFY_CHANNEL, callback)
        return listen


class ListenConnection:
    """A LISTEN connection; ``closed`` completes when the connection is lost."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.add_termination_listener(self._on_termination)

    def _on_termination(self, _connection: object) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def close(self) -> None:
        if not self._connection.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), timeout=5)
        self._on_termination(self._connection)


# -- enqueue helpers (module level so they run on any kind of connection) --------

Fetch = Callable[..., Awaitable[Sequence[Mapping[str, Any]]]]


def _caller_fetch(connection: CallerConnection) -> Fetch:
    """A ``fetch(sql, *args)`` that runs inside the caller's transaction."""
    if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return cast(Fetch, connection.fetch)
    if isinstance(connection, AsyncSession | AsyncConnection):
        sqlalchemy_connection = connection

        async def fetch(sql: str, *args: Any) -> Sequence[Mapping[str, Any]]:
            if isinstance(sqlalchemy_connection, AsyncSession):
                target = await sqlalchemy_connection.connection()
            else:
                target = sqlalchemy_connection
            result = await target.exec_driver_sql(sql, args)
            return cast(Sequence[Mapping[str, Any]], result.mappings().all())

        return fetch
    raise TypeError(
        "connection must be an asyncpg connection or a SQLAlchemy AsyncConnection or "
        f"AsyncSession, got {type(connection).__name__}"
    )


async def _enqueue(fetch: Fetch, specs: Sequence[JobSpec]) -> list[tuple[Job, bool]]:
    if len(specs) == 1:
        rows = list(await fetch(queries.INSERT_JOB, *specs[0].as_row()))
    else:
        columns = [list(column) for column in zip(*(spec.as_row() for spec in specs), strict=True)]
        rows = sorted(await fetch(queries.INSERT_JOBS, *columns), key=lambda row: row["id"])  # insertion order
    return await _match_inserted(fetch, specs, rows)


async def _match_inserted(
    fetch: Fetch, specs: Sequence[JobSpec], inserted: Sequence[Mapping[str, Any]]
) -> list[tuple[Job, bool]]:
    """Pair each spec with its job: the inserted one, or the live job its dedup_key hit."""
    results: list[tuple[Job, bool] | None] = [None] * len(specs)
    by_key = {row["dedup_key"]: row for row in inserted if row["dedup_key"] is not None}
    plain = iter(row for row in inserted if row["dedup_key"] is None)
    missing: list[int] = []
    seen_keys: dict[str, Job] = {}
    for index, spec in enumerate(specs):
        if spec.dedup_key is None:
            results[index] = (inserted_job(next(plain), spec), True)
        elif spec.dedup_key in seen_keys:  # a duplicate within this batch
            results[index] = (seen_keys[spec.dedup_key], False)
        elif spec.dedup_key in by_key:  # the first spec of a key inserted it
            job = inserted_job(by_key[spec.dedup_key], spec)
            seen_keys[spec.dedup_key] = job
            results[index] = (job, True)
        else:
            missing.append(index)
    if missing:
        keys = list({specs[i].dedup_key for i in missing})
        rows = await fetch(queries.SELECT_ALIVE_BY_DEDUP_KEYS, keys)
        alive = {row["dedup_key"]: row_to_job(row) for row in rows}
        retry: list[int] = []
        for index in missing:
            existing = alive.get(specs[index].dedup_key)
            if existing is None:
                retry.append(index)  # the blocking job finished in between: insert again
            else:
                results[index] = (existing, False)
        if retry:
            again = await _enqueue(fetch, [specs[i] for i in retry])
            for index, result in zip(retry, again, strict=True):
                results[index] = result
    return [result for result in results if result is not None]
