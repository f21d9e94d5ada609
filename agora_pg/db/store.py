"""The Store: the one class that talks to PostgreSQL.

It runs the statements of ``agora_pg.db.queries`` on asyncpg connections of its
own (``connections.ConnectionPool``: every call under a deadline), or on the pool
of an engine a caller lent it; Alembic runs on its SQLAlchemy engine. Nothing
else in agora-pg holds an engine, a pool or a connection. The statements of each
table are reached through it: ``store.jobs`` (``job_table``), ``store.runs``,
``store.workers`` and ``store.schedules``; what reads across tables (metrics, the
event stream's reads, pruning) stays here.

Errors leave it in three kinds: ``DatabaseUnavailable`` (the connection is gone,
or ``TransientDatabaseError``: a server error a retry resolves), ``SchemaNotReady``,
and anything else, which the caller records as the failure it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime
from typing import Any, cast

import asyncpg
import asyncpg.pool
import sqlalchemy.exc
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agora_pg.db import queries
from agora_pg.db.connect import Database
from agora_pg.db.connections import (
    CONNECTION_ERRORS,
    ConnectionPool,
    ListenConnection,
    is_transient,
)
from agora_pg.db.job_table import JobTable, queue_limit_of
from agora_pg.db.run_rows import KindLimitNow, MetricsSnapshot, oldest_due_by_queue
from agora_pg.db.run_table import RunTable
from agora_pg.db.schedule_table import ScheduleTable
from agora_pg.db.job_rows import UnhandledJobs
from agora_pg.db.worker_table import WORKER_ALIVE_SECONDS, WorkerTable
from agora_pg.errors import (
    ConnectionLost,
    DatabaseUnavailable,
    SchemaNotReady,
    TransientDatabaseError,
)
from agora_pg.retention import PruneReport, Retention

log = logging.getLogger("agora_pg.store")

NOTIFY_CHANNEL = "agora_jobs"


class Store:
    """Job-queue operations on one database."""

    def __init__(
        self,
        engine: AsyncEngine,
        database: Database,
        *,
        owns_engine: bool = False,
        pool_size: int = 5,
        timeout: float = 30.0,
    ) -> None:
        self._engine = engine
        self.database = database
        self._owns_engine = owns_engine
        self.timeout = timeout
        # Statements of the Store run on its own connections; a borrowed engine's pool
        # is used only when the caller gave one (it may limit connections on purpose).
        self._own = (ConnectionPool(database.asyncpg_url, 2 * pool_size, timeout, database.store_connect_options)
                     if owns_engine else None)
        self._identity: tuple[object, ...] | None = None
        self.jobs = JobTable(self)
        self.runs = RunTable(self)
        self.workers = WorkerTable(self)
        self.schedules = ScheduleTable(self)

    @classmethod
    def open(cls, database: Database, *, pool_size: int = 5, timeout: float = 30.0) -> Store:
        """A Store with its own engine and connections (closed by ``close()``); every
        database call it makes has ``timeout`` seconds."""
        return cls(
            database.create_engine(pool_size=pool_size), database, owns_engine=True, pool_size=pool_size,
            timeout=timeout,
        )

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
        except (sqlalchemy.exc.DBAPIError, *CONNECTION_ERRORS) as error:
            raise self._unavailable(error) from error
        try:
            yield sa_connection
        except (*CONNECTION_ERRORS, sqlalchemy.exc.DBAPIError) as error:
            if isinstance(error, sqlalchemy.exc.DBAPIError) and not _connection_lost(error):
                raise
            # The server restarted or the network broke: every pooled connection is
            # likely dead too, so drop them all rather than fail once per connection.
            await sa_connection.invalidate()
            await self._engine.dispose(close=False)
            raise self._unavailable(error, lost=True) from error
        finally:
            await sa_connection.close()

    @contextlib.asynccontextmanager
    async def connection(self) -> AsyncIterator[asyncpg.Connection]:
        """An asyncpg connection. A connection that cannot be had becomes
        ``DatabaseUnavailable``, one that breaks while in use ``ConnectionLost`` (the
        broken connection is discarded), a server error a retry resolves becomes
        ``TransientDatabaseError``, a missing schema ``SchemaNotReady``."""
        in_use = False  # one of our own connections was handed out: a failure now is one that broke
        try:
            if self._own is None:
                async with self._sa_connection() as sa_connection:
                    raw = await sa_connection.get_raw_connection()  # (_sa_connection says ConnectionLost itself)
                    yield raw.driver_connection
            else:
                async with self._own.acquire() as connection:
                    in_use = True
                    if self.database.transaction_pooling:  # parse and execute on one server connection
                        async with connection.transaction():
                            yield connection
                    else:
                        yield connection
        except CONNECTION_ERRORS as error:
            raise self._unavailable(error, lost=in_use) from error
        except asyncpg.PostgresError as error:
            if is_transient(error):
                raise TransientDatabaseError(
                    f"the database at {self.database.display_url} answered {type(error).__name__}; "
                    f"retrying: {error}"
                ) from error
            if not isinstance(error, asyncpg.UndefinedTableError | asyncpg.InvalidSchemaNameError):
                raise
            raise SchemaNotReady(
                f"the agora schema is missing or incomplete in {self.database.display_url} ({error}): "
                "run agora-pg migrate"
            ) from error

    async def run_sync_in_transaction(self, function: Callable[[SyncConnection], None]) -> None:
        """Run ``function(connection)`` (synchronous SQLAlchemy code such as
        Alembic) in one transaction, committed if it returns."""
        async with self._sa_connection() as sa_connection:
            async with sa_connection.begin():
                await sa_connection.run_sync(function)

    def _unavailable(self, error: BaseException, *, lost: bool = False) -> DatabaseUnavailable:
        """The error to raise for ``error``: ``ConnectionLost`` if ``lost`` (it broke an
        open connection) and it is not a call past its deadline."""
        reason = error.orig if isinstance(error, sqlalchemy.exc.DBAPIError) and error.orig else error
        text = str(reason) or type(reason).__name__
        if isinstance(reason, TimeoutError):
            text, lost = "no answer within the call's deadline", False
        kind = ConnectionLost if lost else DatabaseUnavailable
        return kind(f"cannot use the database at {self.database.display_url}: {text}")

    async def execute(self, sql: str, *args: Any) -> None:
        async with self.connection() as connection:
            await connection.execute(sql, *args)

    async def fetch(self, sql: str, *args: Any, timeout: float | None = None) -> list[asyncpg.Record]:
        """The rows of ``sql``; a call not answered within ``timeout`` (else the Store's) is
        cancelled on the server and raises ``DatabaseUnavailable``."""
        async with self.connection() as connection:
            return cast(list[asyncpg.Record], await connection.fetch(sql, *args, timeout=timeout))

    # -- schema -----------------------------------------------------------------

    async def schema_versions(self) -> set[str]:
        """Applied Alembic revisions; empty when the schema was never migrated."""
        async with self.connection() as connection:
            if not await connection.fetchval(queries.VERSION_TABLE_EXISTS):
                return set()
            return {row["version_num"] for row in await connection.fetch(queries.SELECT_SCHEMA_VERSIONS)}

    # -- the database's clock and identity -------------------------------------------

    async def database_now(self) -> datetime:
        """The database's clock (``clock_timestamp()``)."""
        return cast(datetime, (await self.fetch(queries.DATABASE_NOW))[0][0])

    async def database_identity(self) -> tuple[object, ...]:
        """Which server and database this is (``queries.DATABASE_IDENTITY``), asked once."""
        if self._identity is None:
            rows = await self.fetch(queries.DATABASE_IDENTITY)
            self._identity = tuple(rows[0])
        return self._identity

    # -- reports across tables: metrics, events, the dashboard -------------------------

    async def metrics(self) -> MetricsSnapshot:
        """Queue depth, waiting time, schedule states, flow control and the worker
        processes' counters, in one transaction."""
        async with self.connection() as connection, connection.transaction(readonly=True):
            live = await connection.fetch(queries.METRIC_QUEUE_NOW)
            schedules = await connection.fetch(queries.METRIC_SCHEDULES)
            limits = await connection.fetch(queries.KIND_LIMITS_NOW)
            tallies = await connection.fetch(queries.ALL_TALLIES)
            queue_limits = await connection.fetch(queries.LIMITED_QUEUES, None)
            unhandled = await connection.fetch(queries.UNHANDLED_JOBS, float(WORKER_ALIVE_SECONDS))
        return MetricsSnapshot(
            live_jobs=[(row["queue"], row["state"], row["jobs"]) for row in live],
            oldest_due_seconds=oldest_due_by_queue(
                (row["queue"], row["oldest_due_seconds"]) for row in live if row["oldest_due_seconds"] is not None
            ),
            schedules={row["state"]: row["schedules"] for row in schedules},
            schedules_in_backoff=sum(row["in_backoff"] for row in schedules),
            schedules_orphaned=sum(row["orphaned"] for row in schedules),
            kind_limits=[KindLimitNow(**dict(row.items())) for row in limits],
            tallies=[json.loads(row["tallies"]) for row in tallies],
            queue_limits={row["queue"]: queue_limit_of(row) for row in queue_limits},
            unhandled=[UnhandledJobs(**dict(row.items())) for row in unhandled],
        )

    async def event_times(self, max_lag_seconds: float) -> tuple[datetime, datetime]:
        """The database's now, and the time before which every change is committed
        (``queries.EVENTS_SAFE_TIME``)."""
        rows = await self.fetch(queries.EVENTS_SAFE_TIME, max_lag_seconds)
        return rows[0]["now"], rows[0]["safe"]

    async def read_events(
        self, source: str, since: datetime, filters: tuple[Any, ...],
        after: tuple[datetime, int] | None, limit: int,
    ) -> list[asyncpg.Record]:
        """One page of an event source (``queries.EVENT_SOURCES``): rows stamped at or
        after ``since``, past the ``after`` key of the page before, in order."""
        after_time, after_key = after if after is not None else (since, -1)
        return await self.fetch(queries.EVENT_SOURCES[source], since, *filters, after_time, after_key, limit)

    async def read_rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """The rows of a read-only statement of ``queries`` (the dashboard's) as dicts."""
        return [dict(row) for row in await self.fetch(query, *args)]

    # -- pruning -------------------------------------------------------------------

    async def prune(self, retention: Retention, batch_size: int = 1000) -> PruneReport:
        """Delete finished history older than ``retention`` in batches of ``batch_size``,
        each in a short transaction of its own (no long locks; claims and completions go
        on between batches), until none is left. One process at a time: when another one
        is pruning, this returns at once with ``busy`` set."""
        report = PruneReport()
        steps: list[tuple[str, str, tuple[Any, ...]]] = [
            ("jobs", queries.PRUNE_JOBS, (retention.finished, retention.failed, batch_size)),
            ("pipeline_runs", queries.PRUNE_PIPELINE_RUNS, (retention.finished, batch_size)),
            ("dead_letters", queries.PRUNE_DEAD_LETTERS, (retention.finished, batch_size)),
        ]
        for field, statement, args in steps:
            while True:
                async with self.connection() as connection, connection.transaction():
                    if not await connection.fetchval(queries.TRY_PRUNE_LOCK, queries.PRUNE_LOCK_KEY):
                        report.busy = True
                        return report
                    deleted = _affected(await connection.execute(statement, *args))
                setattr(report, field, getattr(report, field) + deleted)
                if deleted < batch_size:
                    break
        return report

    async def ping(self) -> None:
        await self.fetch(queries.PING)

    # -- notifications -------------------------------------------------------------

    async def listen(self, handlers: Mapping[str, Callable[[str], None]]) -> ListenConnection:
        """A dedicated connection calling ``handlers[channel](payload)`` for every
        notification: ``NOTIFY_CHANNEL`` on every enqueue (payload: the queue),
        ``queries.CANCEL_CHANNEL`` when a running job is to be cancelled (its id),
        ``queries.SCHEDULES_CHANNEL`` when a schedule is resumed or triggered (its pipeline id)."""
        try:
            connection = await asyncpg.connect(self.database.asyncpg_listen_url, timeout=self.timeout)
        except CONNECTION_ERRORS as error:
            raise self._unavailable(error) from error
        except asyncpg.PostgresError as error:  # refused: too many connections, no such database...
            if isinstance(error, asyncpg.TooManyConnectionsError) and self._own is not None:
                self._own.drop_idle()  # an idle pooled connection must not keep the listener out for good
            raise TransientDatabaseError(f"LISTEN connection refused: {error}") from error
        listen = ListenConnection(connection)
        try:
            for channel, handler in handlers.items():
                await connection.add_listener(channel, _notification_callback(handler))
        except (*CONNECTION_ERRORS, asyncpg.PostgresError) as error:
            await listen.close()
            raise self._unavailable(error) from error
        return listen


def _affected(status: str) -> int:
    """The row count of a command status such as ``DELETE 42``."""
    return int(status.rsplit(" ", 1)[-1])


def _notification_callback(handler: Callable[[str], None]) -> Callable[[object, int, str, str], None]:
    def callback(_connection: object, _pid: int, _channel: str, payload: str) -> None:
        handler(payload)

    return callback


def _connection_lost(error: sqlalchemy.exc.DBAPIError) -> bool:
    return bool(error.connection_invalidated) or isinstance(error.orig, CONNECTION_ERRORS)
