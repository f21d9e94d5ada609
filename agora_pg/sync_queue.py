"""Enqueueing from synchronous code (Django, Flask, scripts, Celery-era code).

The statements, the dedup handling and the batch path are the async ``Queue``'s own
(``agora_pg.db.enqueue.insert_jobs``): they are driven here by a fetch that runs
synchronously on a psycopg 3 connection, or on the caller's connection so that the
job commits or rolls back with the caller's transaction.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy.engine import Connection as SAConnection
from sqlalchemy.orm import Session

from agora_pg.db.connect import Database, embedded_database
from agora_pg.db.enqueue import insert_jobs
from agora_pg.db.job_table import JobTable
from agora_pg.db.run_table import RunTable
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable, JobFailed, SchemaNotReady
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.handlers import apply_kinds, kind_table

T = TypeVar("T")
WAIT_POLL_SECONDS = 0.05  # SyncQueue.wait's first pause between looks at the job (x1.5 each, up to 1 s)

_PLACEHOLDER = re.compile(r"\$(\d+)")


@functools.lru_cache(maxsize=64)
def pyformat(sql: str) -> str:
    """``sql`` with asyncpg's ``$1`` placeholders as DB-API ``%(p1)s`` ones (what psycopg,
    psycopg2, Django's cursors and SQLAlchemy's ``exec_driver_sql`` take), ``%`` escaped."""
    return _PLACEHOLDER.sub(r"%(p\1)s", sql.replace("%", "%%"))


def _named(args: Sequence[Any]) -> dict[str, Any]:
    return {f"p{number}": value for number, value in enumerate(args, start=1)}


def run_to_completion(coroutine: Coroutine[Any, Any, T]) -> T:
    """The result of a coroutine none of whose awaits suspends (every database call in it
    is synchronous), without an event loop: usable from any thread, and from code that
    an event loop called synchronously."""
    try:
        coroutine.send(None)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    coroutine.close()
    raise RuntimeError("the enqueue suspended: a synchronous fetch awaited real I/O")


def _rows_from_cursor(cursor: Any) -> list[dict[str, Any]]:
    if cursor.description is None:
        return []
    names = [column[0] for column in cursor.description]
    # (a connection the caller gave may have a row factory of its own: dict_row, namedtuple_row)
    return [dict(row) if isinstance(row, Mapping) else dict(zip(names, row, strict=True))
            for row in cursor.fetchall()]


def _sync_fetch(connection: Any) -> Any:
    """An async ``fetch(sql, *args)`` that runs synchronously on ``connection``: a SQLAlchemy
    ``Session`` or ``Connection``, or any DB-API connection with ``cursor()`` (psycopg 3,
    psycopg2, Django's ``django.db.connection``)."""
    if isinstance(connection, Session | SAConnection):

        async def fetch_sqlalchemy(sql: str, *args: Any) -> list[dict[str, Any]]:
            target = connection.connection() if isinstance(connection, Session) else connection
            result = target.exec_driver_sql(pyformat(sql), _named(args))
            return [dict(row) for row in result.mappings()] if result.returns_rows else []

        return fetch_sqlalchemy
    if callable(getattr(connection, "cursor", None)):

        async def fetch_dbapi(sql: str, *args: Any) -> list[dict[str, Any]]:
            cursor = connection.cursor()
            try:
                cursor.execute(pyformat(sql), _named(args))
                return _rows_from_cursor(cursor)
            finally:
                cursor.close()

        return fetch_dbapi
    raise TypeError(
        "connection must be a DB-API connection (psycopg 3, psycopg2, django.db.connection) "
        f"or a SQLAlchemy Session or Connection, got {type(connection).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class _FetchOnly:
    """A ``fetch(sql, *args)`` in the place of a Store, for its table classes."""

    fetch: Callable[..., Coroutine[Any, Any, list[dict[str, Any]]]]


def _spec(kind: str, payload: Any, **options: Any) -> JobSpec:
    return JobSpec(kind=kind, payload={} if payload is None else payload, **options)


class SyncQueue:
    """Enqueue jobs from code that cannot await.

    >>> with SyncQueue.connect() as queue:          # DATABASE_URL, or the embedded server
    ...     job = queue.enqueue("send_email", {"to": "a@b.c"})
    ...     queue.get(job.id).status, queue.wait(job.id, timeout=30)

    One psycopg 3 connection (in autocommit), opened on first use, shared by the threads
    of the process (calls on it take turns). With ``connection=``, the job is written on
    the caller's connection instead and commits or rolls back with its transaction.
    Needs the ``sync`` extra (``pip install -e '.[sync]'`` in agora-pg's checkout).
    """

    def __init__(self, database: Database, settings: Settings | None = None, handlers: Any = None) -> None:
        self.database = database
        self.settings = settings if settings is not None else Settings()
        self.kinds = kind_table(handlers)
        self._connection: Any = None
        self._lock = threading.Lock()

    @classmethod
    def connect(
        cls, database_url: str | None = None, settings: Settings | None = None, *, handlers: Any = None
    ) -> SyncQueue:
        """A queue on ``database_url``, else on the settings' database (from the environment
        by default), else on the embedded server. Use it in a ``with`` block, or ``close()`` it.
        ``handlers``: as ``Queue.connect``'s (each kind's options apply)."""
        settings = settings if settings is not None else load_settings(os.environ)
        url = database_url if database_url is not None else settings.database_url
        database = (Database.from_settings(settings, url) if url is not None
                    else embedded_database(settings.data_dir))
        return cls(database, settings, handlers)

    def __enter__(self) -> SyncQueue:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the queue's own connection (the caller's connections are left alone)."""
        with self._lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def enqueue(
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
        connection: Any = None,
    ) -> Job:
        """Store one job and return it; the arguments, dedup and errors are ``Queue.enqueue``'s."""
        spec = _spec(kind, payload, name=name, queue=queue, priority=priority, run_at=run_at,
                     max_retries=max_retries, dedup_key=dedup_key, timeout_seconds=timeout_seconds)
        [(job, _created)] = self._insert([spec], connection)
        return job

    def enqueue_many(self, specs: Iterable[JobSpec], *, connection: Any = None) -> list[Job]:
        """Store many jobs in one statement; returns them in the order given."""
        return [job for job, _created in self._insert(list(specs), connection)]

    def get(self, job_id: int) -> Job:
        """The job with this id (``JobNotFound`` otherwise), as ``Queue.get``."""
        return self._on_own_connection(lambda store: JobTable(store).get(job_id))

    def cancel(self, job_id: int) -> Job:
        """Cancel a job, as ``Queue.cancel``: one that has not started at once; a running one
        is stopped by its worker (returned still processing, with ``cancel_requested_at``
        set). ``InvalidTransition`` for a finished job, ``JobNotFound`` for an unknown id."""
        return self._on_own_connection(lambda store: JobTable(store).cancel(job_id))

    def wait(self, job_id: int, *, timeout: float | None = None) -> Any:
        """Block until the job has finished for good and return its result, as
        ``Queue.wait``: ``JobFailed`` for a job that failed for good or was cancelled,
        ``TimeoutError`` after ``timeout`` seconds (the job is left as it is),
        ``JobNotFound`` for an unknown id. It looks at the job every
        ``WAIT_POLL_SECONDS`` at first, then less often (up to once a second): a
        synchronous caller has no event loop to follow the job's events on."""
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = WAIT_POLL_SECONDS
        while not (job := self.get(job_id)).is_finished:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"job {job_id} did not finish within {timeout:g}s (it is {job.status.value})")
            time.sleep(pause if left is None else min(pause, left))
            pause = min(pause * 1.5, 1.0)
        if job.status is not JobStatus.DONE:
            raise JobFailed(job.id, job.status.value, job.error_message)
        runs = self._on_own_connection(lambda store: RunTable(store).of_job(job_id))
        return next((run.result for run in runs if run.status == "succeeded"), None)

    def _on_own_connection(self, call: Callable[[Store], Coroutine[Any, Any, T]]) -> T:
        """Run a store table's statement on the queue's own connection, synchronously."""
        with self._lock, self._translated_errors(reconnect=True):
            # (JobTable and RunTable use nothing of a Store but fetch())
            store = cast(Store, _FetchOnly(_sync_fetch(self._own_connection())))
            return run_to_completion(call(store))

    def _insert(self, specs: list[JobSpec], connection: Any) -> list[tuple[Job, bool]]:
        if not specs:
            return []
        specs, own = apply_kinds(self.kinds, specs), connection is None  # (the caller's: not ours to reconnect)
        with self._lock if own else contextlib.nullcontext(), self._translated_errors(reconnect=own):
            return run_to_completion(insert_jobs(_sync_fetch(self._own_connection() if own else connection), specs))

    def _own_connection(self) -> Any:
        if self._connection is None or self._connection.closed:
            psycopg = _import_psycopg()
            self._connection = psycopg.connect(self.database.asyncpg_url, autocommit=True,
                                               connect_timeout=max(1, int(self.settings.database_timeout)),
                                               **({"prepare_threshold": None}
                                                  if self.database.transaction_pooling else {}))
        return self._connection

    @contextlib.contextmanager
    def _translated_errors(self, reconnect: bool) -> Iterator[None]:
        """A lost connection becomes ``DatabaseUnavailable`` (the queue's own connection
        is dropped, and the next call opens a new one); a missing schema ``SchemaNotReady``.
        An enqueue whose reply was lost may have committed: retry with a ``dedup_key``."""
        psycopg = _import_psycopg() if reconnect else _try_import_psycopg()
        try:
            yield
        except Exception as raised:
            # SQLAlchemy wraps the driver's error; judge by the driver's own
            error = getattr(raised, "orig", None) or raised
            if psycopg is None:
                raise
            if isinstance(error, psycopg.errors.UndefinedTable | psycopg.errors.InvalidSchemaName):
                raise SchemaNotReady(
                    f"the agora schema is missing or incomplete ({error}): run agora-pg migrate"
                ) from raised
            if isinstance(error, psycopg.OperationalError) and reconnect:
                if self._connection is not None:
                    with contextlib.suppress(Exception):
                        self._connection.close()
                    self._connection = None
                raise DatabaseUnavailable(
                    f"cannot use the database at {self.database.display_url}: {error}"
                ) from raised
            raise


def _try_import_psycopg() -> Any:
    try:
        import psycopg
    except ImportError:
        return None
    return psycopg


def _import_psycopg() -> Any:
    psycopg = _try_import_psycopg()
    if psycopg is None:
        raise ImportError("SyncQueue needs psycopg 3: pip install -e '.[sync]' in agora-pg's checkout")
    return psycopg
