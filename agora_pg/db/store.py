"""The Store: the one class that talks to PostgreSQL.

It runs the statements of ``agora_pg.db.queries`` on asyncpg connections of its
own (``connections.ConnectionPool``: every call under a deadline), or on the pool
of an engine a caller lent it; Alembic runs on its SQLAlchemy engine. Nothing
else in agora-pg holds an engine, a pool or a connection.

Errors leave it in three kinds: ``DatabaseUnavailable`` (the connection is gone,
or ``TransientDatabaseError``: a server error a retry resolves), ``SchemaNotReady``,
and anything else, which the caller records as the failure it is.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from datetime import datetime
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any, cast

import asyncpg
import asyncpg.pool
import sqlalchemy.exc
from sqlalchemy.engine import Connection as SyncConnection
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from agora_pg.db import queries
from agora_pg.db.connect import Database
from agora_pg.db.connections import CONNECTION_ERRORS, ConnectionPool, ListenConnection, is_transient
from agora_pg.db.enqueue import CallerConnection, caller_fetch, insert_jobs
from agora_pg.db.job_rows import row_to_job
from agora_pg.db.schedule_rows import (
    ClaimedRun,
    DueTick,
    RunFinish,
    ScheduleRegistration,
    ScheduleRow,
    TickJob,
)
from agora_pg.db.job_rows import JobFinish, LeaseRenewal, Promotion
from agora_pg.db.run_rows import MetricsSnapshot, RunRow, oldest_due_by_queue
from agora_pg.errors import (
    ConnectionLost,
    DatabaseUnavailable,
    InvalidTransition,
    JobConflict,
    JobNotFound,
    ScheduleConflict,
    ScheduleNotFound,
    SchemaNotReady,
    TransientDatabaseError,
)
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus, possible_job_id
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
        self._own = (ConnectionPool(database.asyncpg_url, 2 * pool_size, timeout, database.connect_options)
                     if owns_engine else None)
        self._identity: tuple[object, ...] | None = None

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
            text, lost = f"no answer within {self.timeout:g}s", False
        kind = ConnectionLost if lost else DatabaseUnavailable
        return kind(f"cannot use the database at {self.database.display_url}: {text}")

    async def _execute(self, sql: str, *args: Any) -> None:
        async with self.connection() as connection:
            await connection.execute(sql, *args)

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
        self,
        specs: Sequence[JobSpec],
        connection: CallerConnection | None = None,
        default_max_retries: int | None = None,
    ) -> list[tuple[Job, bool]]:
        """Insert jobs; returns each job with ``True`` if it was inserted or
        ``False`` if a live job with its dedup_key was returned instead.
        ``default_max_retries`` applies to specs that leave ``max_retries`` unset."""
        if not specs:
            return []
        if connection is not None:
            return await insert_jobs(caller_fetch(connection), specs, default_max_retries)
        async with self.connection() as own:
            return await insert_jobs(own.fetch, specs, default_max_retries)

    # -- reading and cancelling --------------------------------------------------

    async def database_now(self) -> datetime:
        """The database's clock (``clock_timestamp()``)."""
        async with self.connection() as connection:
            return cast(datetime, await connection.fetchval(queries.DATABASE_NOW))

    async def read_database_clock(self) -> tuple[datetime, float]:
        """A reading of the database clock: the start of a statement by the database,
        and this host's monotonic time when the statement was sent."""
        async with self.connection() as connection:
            sent_at = time.monotonic()
            return cast(datetime, await connection.fetchval(queries.STATEMENT_NOW)), sent_at

    async def count_work_due_now(self, queues: Sequence[str], default_max_retries: int) -> int:
        """Jobs of ``queues`` running, or claimable and due now."""
        async with self.connection() as connection:
            return cast(int, await connection.fetchval(queries.COUNT_WORK_DUE_NOW, list(queues), default_max_retries))

    async def jobs_finished_since(self, since: datetime) -> list[tuple[Job, Any]]:
        """Jobs with an attempt that ended at or after ``since`` (by the database's clock),
        each with its result (None unless an attempt succeeded and returned one)."""
        finished = []
        for row in await self._fetch(queries.JOBS_FINISHED_SINCE, since):
            fields = dict(row.items())
            result = fields.pop("result")
            finished.append((row_to_job(fields), None if result is None else json.loads(result)))
        return finished

    async def get_job(self, job_id: int) -> Job:
        _require_possible(job_id)
        rows = await self._fetch(queries.SELECT_JOB, job_id)
        if not rows:
            raise JobNotFound(job_id)
        return row_to_job(rows[0])

    async def cancel_job(self, job_id: int) -> Job:
        """Cancel a job that has not started yet, or ask the worker running it to stop it
        (the job is returned still ``processing``, with ``cancel_requested_at`` set)."""
        _require_possible(job_id)
        rows = await self._fetch(queries.CANCEL_JOB, job_id)
        if rows:
            return row_to_job(rows[0])
        job = await self.get_job(job_id)
        raise InvalidTransition(job_id, job.status.value, JobStatus.CANCELLED.value)

    async def list_jobs(self, filters: Mapping[str, Any], limit: int) -> list[Job]:
        """Jobs newest first; ``filters`` maps names of ``queries.JOB_FILTERS`` to values
        (``before_id`` pages: the jobs older than that id)."""
        names = [name for name in queries.JOB_FILTERS if filters.get(name) is not None]
        rows = await self._fetch(queries.list_jobs(names), *(filters[name] for name in names), limit)
        return [row_to_job(row) for row in rows]

    async def job_runs(self, job_id: int) -> list[RunRow]:
        """Every recorded attempt of a job, oldest first."""
        _require_possible(job_id)
        return [RunRow.from_row(row) for row in await self._fetch(queries.SELECT_JOB_RUNS, job_id)]

    async def retry_job(self, job_id: int) -> Job:
        """Put a failed or cancelled job back to pending, due now."""
        _require_possible(job_id)
        try:
            rows = await self._fetch(queries.RETRY_JOB, job_id)
        except asyncpg.UniqueViolationError:
            raise JobConflict(job_id, "another live job holds its dedup_key") from None
        if rows:
            return row_to_job(rows[0])
        job = await self.get_job(job_id)
        raise InvalidTransition(job_id, job.status.value, JobStatus.PENDING.value)

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

    async def complete_succeeded(
        self, attempts: Sequence[tuple[int, int]], worker_id: str, results: Mapping[int, str] | None = None
    ) -> set[int]:
        """Mark ``(job_id, attempt)`` pairs done, recording ``results[job_id]`` (JSON text)
        where given; returns the ids that were still held. Rows are locked in id order, as
        by every outcome statement, so they cannot deadlock."""
        attempts = sorted(attempts)
        results = results or {}
        rows = await self._fetch(
            queries.COMPLETE_SUCCEEDED, [a[0] for a in attempts], [a[1] for a in attempts], worker_id,
            [results.get(a[0]) for a in attempts],
        )
        return {row["job_id"] for row in rows}

    async def finish_jobs(
        self, finishes: Sequence[JobFinish], worker_id: str, max_lost_attempts: int, default_max_retries: int
    ) -> set[int]:
        """Record outcomes other than success (``queries.FINISH_JOBS``); returns the ids
        of the attempts that were still held (the others were taken over meanwhile)."""
        finishes = sorted(finishes, key=lambda finish: finish.job_id)
        rows = await self._fetch(
            queries.FINISH_JOBS, worker_id, max_lost_attempts, default_max_retries,
            [f.job_id for f in finishes], [f.attempt for f in finishes], [f.kind for f in finishes],
            [f.error_type for f in finishes], [f.error_message for f in finishes],
            [f.traceback for f in finishes], [f.delay_seconds for f in finishes], [f.final for f in finishes],
        )
        return {row["id"] for row in rows}

    async def release_claimed_jobs(self, worker_id: str, attempts: Sequence[tuple[int, int]]) -> set[int]:
        """Give back claimed ``(job_id, attempt)`` pairs this worker will not start, uncounted."""
        rows = await self._fetch(
            queries.RELEASE_CLAIMED_JOBS, worker_id, [a[0] for a in attempts], [a[1] for a in attempts]
        )
        return {row["id"] for row in rows}

    async def release_unstarted_jobs(self, worker_id: str, running: Sequence[int]) -> set[int]:
        """Give back the jobs ``worker_id`` holds but never started (``running``: ids to keep)."""
        rows = await self._fetch(queries.RELEASE_UNSTARTED_JOBS, worker_id, list(running))
        return {row["id"] for row in rows}

    async def adopt_unknown_jobs(self, worker_id: str, known: Sequence[int], lease_seconds: float) -> list[Job]:
        """The jobs ``worker_id`` holds beyond ``known`` (a claim whose reply was lost)."""
        rows = await self._fetch(queries.ADOPT_UNKNOWN_JOBS, worker_id, list(known), float(lease_seconds))
        return [row_to_job(row) for row in rows]

    async def promote_due_jobs(self, limit: int) -> Promotion:
        """Move up to ``limit`` delayed jobs whose run_at has passed into the claim index."""
        [row] = await self._fetch(queries.PROMOTE_DUE_JOBS, limit)
        return Promotion(row["promoted"], row["next_in_seconds"])

    async def rescue_expired(self, max_lost_attempts: int, default_max_retries: int, limit: int) -> list[int]:
        """Take back processing jobs whose lease passed (their worker's, or their own); returns their ids."""
        rows = await self._fetch(queries.RESCUE_EXPIRED, max_lost_attempts, default_max_retries, limit)
        return [row["id"] for row in rows]

    async def renew_leases(
        self,
        worker_id: str,
        lease_seconds: float,
        jobs: Sequence[tuple[int, int]],
        runs: Sequence[tuple[str, int]],
    ) -> LeaseRenewal:
        """Extend the worker's lease (which covers its jobs) and exactly these pipeline-run
        leases ``(id, run_id)``; of the job attempts ``(id, attempt)`` it holds, says which are
        lost and which are to be cancelled, and which jobs it holds without listing them."""
        rows = await self._fetch(
            queries.RENEW_LEASES, worker_id, float(lease_seconds),
            [job[0] for job in jobs], [job[1] for job in jobs], [run[0] for run in runs], [run[1] for run in runs],
        )
        row = rows[0]
        return LeaseRenewal(
            lost_jobs=frozenset(zip(row["lost_job_ids"], row["lost_job_attempts"], strict=True)),
            cancel_jobs=frozenset(zip(row["cancel_job_ids"], row["cancel_job_attempts"], strict=True)),
            lost_runs=frozenset(row["lost_runs"]),
            unknown_jobs=frozenset(row["unknown_job_ids"]),
            worker_renewed=row["worker_renewed"],
        )

    # -- workers -------------------------------------------------------------------

    async def register_worker(
        self, worker_id: str, hostname: str, pid: int, queues: Sequence[str], *, runs_pipelines: bool = False
    ) -> None:
        """Record a starting worker: its job worker (``queues``) or, with
        ``runs_pipelines``, its scheduled pipelines; the second call adds to the row."""
        await self._execute(queries.INSERT_WORKER, worker_id, hostname, pid, list(queues), runs_pipelines)

    async def live_pipeline_workers(self, lease_seconds: float) -> tuple[list[str], datetime, float]:
        """The ids of the workers running scheduled pipelines whose lease is live, or
        which started less than ``lease_seconds`` ago and have not renewed it yet; and a
        reading of the database clock (as ``read_database_clock``)."""
        async with self.connection() as connection:
            sent_at = time.monotonic()
            row = await connection.fetchrow(queries.LIVE_PIPELINE_WORKERS, float(lease_seconds))
        assert row is not None
        return list(row["ids"]), row["database_now"], sent_at

    async def stop_worker(self, worker_id: str) -> None:
        await self._execute(queries.STOP_WORKER, worker_id)

    async def delete_stale_workers(self, older_than_seconds: float) -> None:
        await self._execute(queries.DELETE_STALE_WORKERS, float(older_than_seconds))

    async def lease_uncovered_jobs(self, lease_seconds: float) -> None:
        """Give running jobs whose worker's row is gone a lease of their own."""
        await self._execute(queries.LEASE_UNCOVERED_JOBS, float(lease_seconds))

    async def settle_worker_leases(self, passed_seconds: float) -> None:
        """Let go of worker leases that passed ``passed_seconds`` ago and cover no job."""
        await self._execute(queries.SETTLE_WORKER_LEASES, float(passed_seconds))

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
            registration.new_launch,
            registration.job_kind,
        )
        return ScheduleRow.from_row(rows[0])

    async def database_identity(self) -> tuple[object, ...]:
        """Which server and database this is (``queries.DATABASE_IDENTITY``), asked once."""
        if self._identity is None:
            rows = await self._fetch(queries.DATABASE_IDENTITY)
            self._identity = tuple(rows[0])
        return self._identity

    async def launch_once_again(self, pipeline_id: str, spec: str) -> ScheduleRow | None:
        """Make a completed once-per-launch schedule due now (another launch completed it
        meanwhile); None if it is not completed (any more)."""
        rows = await self._fetch(queries.LAUNCH_ONCE_AGAIN, pipeline_id, spec)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def get_schedule(self, pipeline_id: str) -> ScheduleRow | None:
        rows = await self._fetch(queries.SELECT_SCHEDULE, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def get_schedules(self, pipeline_ids: Sequence[str]) -> dict[str, ScheduleRow]:
        """The schedule rows of ``pipeline_ids`` (one statement), by pipeline id; a
        pipeline without one is absent."""
        rows = await self._fetch(queries.SELECT_SCHEDULES, list(pipeline_ids))
        return {row["pipeline_id"]: ScheduleRow.from_row(row) for row in rows}

    async def enqueue_due_ticks(
        self, wanted: Sequence[tuple[str, str]], plan: Callable[[DueTick], TickJob], worker_id: str
    ) -> list[tuple[TickJob, Job]]:
        """Turn the due ticks of the schedules ``wanted`` ((pipeline id, spec) pairs) into
        jobs, in one transaction: lock them, ``plan`` each (pure: the job and the next run),
        insert the jobs, advance the schedules and record each tick as a run. Ticks another
        process is enqueueing are skipped."""
        ids, specs = [pipeline_id for pipeline_id, _ in wanted], [spec for _, spec in wanted]
        async with self.connection() as connection, connection.transaction():
            rows = await connection.fetch(queries.DUE_TICKS, ids, specs)
            if not rows:
                return []
            ticks = [plan(DueTick(row["pipeline_id"], row["tick"], row["database_now"])) for row in rows]
            jobs = [job for job, _inserted in await insert_jobs(connection.fetch, [tick.job for tick in ticks])]
            await connection.execute(
                queries.RECORD_TICKS, [tick.pipeline_id for tick in ticks], [tick.tick for tick in ticks],
                [job.id for job in jobs], [tick.next_run_at for tick in ticks], worker_id,
            )
        return list(zip(ticks, jobs, strict=True))

    async def next_tick_in(self, wanted: Sequence[tuple[str, str]]) -> float | None:
        """Seconds until the first of the schedules ``wanted`` falls due (None: none is active)."""
        ids, specs = [pipeline_id for pipeline_id, _ in wanted], [spec for _, spec in wanted]
        async with self.connection() as connection:
            seconds = await connection.fetchval(queries.NEXT_TICK_IN, ids, specs)
        return None if seconds is None else float(seconds)

    async def claim_pipeline_runs(
        self, pipelines: Sequence[tuple[str, str]], worker_id: str, lease_seconds: float
    ) -> dict[str, ClaimedRun]:
        """Claim the due runs of ``(pipeline_id, spec)`` pairs in one statement; the claimed
        ones by pipeline id (one not due, leased elsewhere or registered with another spec
        is absent). Pipeline ids must be distinct."""
        async with self.connection() as connection:
            sent_at = time.monotonic()
            rows = await connection.fetch(
                queries.CLAIM_PIPELINE_RUNS, [pipeline_id for pipeline_id, _ in pipelines], worker_id,
                [spec for _, spec in pipelines], float(lease_seconds),
            )
        return {
            row["pipeline_id"]: ClaimedRun(
                ScheduleRow.from_row(row), run_id=row["run_id"], scheduled_for=row["scheduled_for"],
                database_now=row["database_now"], sent_at=sent_at,
            )
            for row in rows
        }

    async def claim_pipeline_run(
        self, pipeline_id: str, spec: str, worker_id: str, lease_seconds: float
    ) -> ClaimedRun | None:
        """Claim the pipeline's due run, or None when it is not due, leased or not ours."""
        return (await self.claim_pipeline_runs([(pipeline_id, spec)], worker_id, lease_seconds)).get(pipeline_id)

    async def rescue_pipeline_run(self, pipeline_id: str) -> ScheduleRow | None:
        """Take the run over from a worker whose lease expired (counted as a failed run);
        the schedule's new row, or None when there was nothing to take over."""
        rows = await self._fetch(queries.RESCUE_PIPELINE_RUN, pipeline_id)
        return ScheduleRow.from_row(rows[0]) if rows else None

    async def finish_pipeline_runs(self, finishes: Sequence[RunFinish]) -> set[str]:
        """Record runs' ends in one statement; the pipeline ids whose run was recorded (one
        absent: its worker no longer held the lease). Pipeline ids must be distinct."""
        columns = (
            "pipeline_id", "worker_id", "run_id", "status", "error_type", "error_message", "consecutive_errors",
            "next_run_at", "state", "next_run_in_seconds", "traceback",
        )
        rows = await self._fetch(
            queries.FINISH_PIPELINE_RUNS, *([getattr(finish, column) for finish in finishes] for column in columns)
        )
        return {row["pipeline_id"] for row in rows}

    async def finish_pipeline_run(self, finish: RunFinish) -> bool:
        """Record a run's end; False if this worker no longer held the lease."""
        return finish.pipeline_id in await self.finish_pipeline_runs([finish])

    async def release_pipeline_run(self, pipeline_id: str, worker_id: str, run_id: int) -> bool:
        rows = await self._fetch(queries.RELEASE_PIPELINE_RUN, pipeline_id, worker_id, run_id)
        return bool(rows)

    async def list_schedules(self) -> list[ScheduleRow]:
        return [ScheduleRow.from_row(row) for row in await self._fetch(queries.LIST_SCHEDULES)]

    async def pause_schedule(self, pipeline_id: str) -> ScheduleRow:
        """Stop starting runs of a schedule until it is resumed."""
        return await self._change_schedule(
            queries.PAUSE_SCHEDULE, pipeline_id, "pause", "only an active schedule pauses"
        )

    async def resume_schedule(self, pipeline_id: str) -> ScheduleRow:
        """Start a paused or stopped schedule again."""
        return await self._change_schedule(
            queries.RESUME_SCHEDULE, pipeline_id, "resume", "a completed once schedule does not run again"
        )

    async def trigger_schedule(self, pipeline_id: str) -> ScheduleRow:
        """Make an active, idle schedule due now (it runs once, then on its schedule)."""
        return await self._change_schedule(
            queries.TRIGGER_SCHEDULE, pipeline_id, "trigger",
            "only an active schedule that is not running can be triggered",
        )

    async def _change_schedule(self, statement: str, pipeline_id: str, action: str, problem: str) -> ScheduleRow:
        rows = await self._fetch(statement, pipeline_id)
        if rows:
            return ScheduleRow.from_row(rows[0])
        row = await self.get_schedule(pipeline_id)
        if row is None:
            raise ScheduleNotFound(pipeline_id)
        state = "running" if row.state == "active" and row.lease_owner is not None else row.state
        raise ScheduleConflict(pipeline_id, state, action, problem)

    async def list_runs(self, filters: Mapping[str, Any], limit: int) -> list[RunRow]:
        """Runs newest first; ``filters`` maps names of ``queries.RUN_FILTERS`` to values."""
        names = [name for name in queries.RUN_FILTERS if filters.get(name) is not None]
        rows = await self._fetch(queries.list_runs(names), *(filters[name] for name in names), limit)
        return [RunRow.from_row(row) for row in rows]

    async def metrics(self, recent_window_seconds: float = 300.0) -> MetricsSnapshot:
        """Queue depth, waiting time, recent run outcomes and schedule states, in one transaction."""
        async with self.connection() as connection, connection.transaction(readonly=True):
            live = await connection.fetch(queries.METRIC_QUEUE_NOW)
            runs = await connection.fetch(queries.METRIC_RECENT_RUNS, recent_window_seconds)
            schedules = await connection.fetch(queries.METRIC_SCHEDULES)
        return MetricsSnapshot(
            live_jobs=[(row["queue"], row["state"], row["jobs"]) for row in live],
            oldest_due_seconds=oldest_due_by_queue(
                (row["queue"], row["oldest_due_seconds"]) for row in live if row["oldest_due_seconds"] is not None
            ),
            recent_runs={row["status"]: row["runs"] for row in runs},
            recent_window_seconds=recent_window_seconds,
            schedules={row["state"]: row["schedules"] for row in schedules},
            schedules_in_backoff=sum(row["in_backoff"] for row in schedules),
        )

    # -- progress and events ---------------------------------------------------------

    async def report_job_progress(self, worker_id: str, reports: Sequence[tuple[int, int, str]]) -> None:
        """Store and publish the latest progress (JSON) of attempts ``(job_id, attempt)`` this
        worker still holds (``queries.REPORT_JOB_PROGRESS``)."""
        await self._fetch(
            queries.REPORT_JOB_PROGRESS, worker_id,
            [r[0] for r in reports], [r[1] for r in reports], [r[2] for r in reports],
        )

    async def report_run_progress(self, run_id: int, document: str) -> None:
        """Store and publish a running pipeline run's progress (JSON)."""
        await self._fetch(queries.REPORT_RUN_PROGRESS, run_id, document)

    async def event_times(self, max_lag_seconds: float) -> tuple[datetime, datetime]:
        """The database's now, and the time before which every change is committed
        (``queries.EVENTS_SAFE_TIME``)."""
        rows = await self._fetch(queries.EVENTS_SAFE_TIME, max_lag_seconds)
        return rows[0]["now"], rows[0]["safe"]

    async def read_events(
        self, source: str, since: datetime, filters: tuple[Any, ...],
        after: tuple[datetime, int] | None, limit: int,
    ) -> list[asyncpg.Record]:
        """One page of an event source (``queries.EVENT_SOURCES``): rows stamped at or
        after ``since``, past the ``after`` key of the page before, in order."""
        after_time, after_key = after if after is not None else (since, -1)
        return await self._fetch(queries.EVENT_SOURCES[source], since, *filters, after_time, after_key, limit)

    async def read_rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        """The rows of a read-only statement of ``queries`` (the dashboard's) as dicts."""
        return [dict(row) for row in await self._fetch(query, *args)]

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
        async with self.connection() as connection:
            await connection.fetchval(queries.PING)

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


def _require_possible(job_id: int) -> None:
    if not possible_job_id(job_id):
        raise JobNotFound(job_id)
