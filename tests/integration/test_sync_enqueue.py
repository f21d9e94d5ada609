"""SyncQueue: enqueueing from synchronous code, on its own connection or inside the
caller's psycopg / SQLAlchemy transaction."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from datetime import UTC, datetime

import psycopg
from psycopg.rows import dict_row
import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.orm import Session

from agora_pg import (DatabaseUnavailable, InvalidJob, Job, JobSpec, JobStatus, Queue, SchemaNotReady, SyncQueue,
                      Worker)
from agora_pg.errors import InvalidTransition, JobFailed, JobNotFound
from agora_pg.settings import Settings

from .helpers import running


@pytest.fixture
def sync_queue(database_url: str, settings: Settings) -> Iterator[SyncQueue]:
    with SyncQueue.connect(database_url, settings) as queue:
        yield queue


def _count(database_url: str, where: str = "true") -> int:
    with psycopg.connect(database_url) as connection:
        row = connection.execute(f"SELECT count(*) FROM agora.jobs WHERE {where}").fetchone()
        assert row is not None
        return int(row[0])


async def test_a_sync_enqueue_stores_the_job_the_async_queue_reads(sync_queue: SyncQueue, queue: Queue) -> None:
    when = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    job = sync_queue.enqueue("report", {"n": 1}, name="monthly", queue="reports", priority=7, run_at=when,
                             max_retries=9, dedup_key="report-2031-05", timeout_seconds=12.5)
    assert (job.name, job.kind, job.queue, job.priority, job.run_at, job.max_retries, job.dedup_key,
            job.timeout_seconds, job.status) == (
        "monthly", "report", "reports", 7, when, 9, "report-2031-05", 12.5, JobStatus.PENDING)
    assert await queue.get(job.id) == job
    plain = sync_queue.enqueue("echo")
    assert plain.payload == {} and plain.max_retries is None  # its kind's, else the worker's WORKER_MAX_RETRIES
    assert await queue.get(plain.id) == plain


async def test_sync_dedup_and_batches_behave_as_the_async_queue(sync_queue: SyncQueue, queue: Queue) -> None:
    first = sync_queue.enqueue("mail", {"to": "a"}, dedup_key="welcome:1")
    again = sync_queue.enqueue("mail", {"to": "b"}, dedup_key="welcome:1")
    assert again.id == first.id and again.payload == {"to": "a"}  # the live job, decoded from jsonb
    jobs = sync_queue.enqueue_many([JobSpec("k", {"i": i}, priority=i % 3) for i in range(50)])
    assert [job.payload["i"] for job in jobs] == list(range(50))
    assert [await queue.get(job.id) for job in jobs] == jobs
    keyed = sync_queue.enqueue_many([JobSpec("mail", {"n": 1}, dedup_key="welcome:1"),
                                     JobSpec("mail", {"n": 2}, dedup_key="welcome:2"),
                                     JobSpec("mail", {"n": 3}, dedup_key="welcome:2")])
    assert keyed[0].id == first.id
    assert keyed[1].id == keyed[2].id != first.id
    assert sync_queue.enqueue_many([]) == []


def test_a_job_enqueued_in_a_rolled_back_psycopg_transaction_leaves_nothing(
    sync_queue: SyncQueue, database_url: str
) -> None:
    # Django's atomic() is this: BEGIN on the request's connection, ROLLBACK on an exception
    listener = psycopg.connect(database_url, autocommit=True)
    try:
        listener.execute("LISTEN agora_jobs")
        with psycopg.connect(database_url) as connection:  # autocommit off: a transaction opens
            job = sync_queue.enqueue("send_email", {"to": "a@b.c"}, connection=connection)
            rows = connection.execute("SELECT count(*) FROM agora.jobs WHERE id = %s", (job.id,)).fetchone()
            assert rows == (1,)  # visible inside the caller's transaction
            assert _count(database_url) == 0  # and nowhere else yet
            connection.rollback()
        assert _count(database_url) == 0
        assert list(listener.notifies(timeout=0.3, stop_after=1)) == []  # nothing woke a worker
        with psycopg.connect(database_url, row_factory=dict_row) as connection:  # a row factory of the caller's
            with connection.transaction():
                kept = sync_queue.enqueue_many([JobSpec("send_email", {"i": i}) for i in range(3)],
                                               connection=connection)
        assert _count(database_url, f"id = ANY(ARRAY{[job.id for job in kept]}::bigint[])") == 3
        woken = list(listener.notifies(timeout=5, stop_after=1))
        assert [(note.channel, note.payload) for note in woken] == [("agora_jobs", "default")]  # at commit
    finally:
        listener.close()


def test_a_job_enqueued_in_a_sqlalchemy_session_commits_and_rolls_back_with_it(
    sync_queue: SyncQueue, database_url: str
) -> None:
    engine = create_engine("postgresql+psycopg://", creator=lambda: psycopg.connect(database_url))
    try:
        with Session(engine) as session:
            session.execute(text("CREATE TABLE public.orders (id int PRIMARY KEY)"))
            session.execute(text("INSERT INTO public.orders VALUES (1)"))
            sync_queue.enqueue("ship", {"order": 1}, connection=session)
            session.rollback()
        assert _count(database_url) == 0
        with Session(engine) as session, session.begin():
            session.execute(text("CREATE TABLE public.orders (id int PRIMARY KEY)"))
            session.execute(text("INSERT INTO public.orders VALUES (1)"))
            shipped = sync_queue.enqueue("ship", {"order": 1}, dedup_key="ship:1", connection=session)
            again = sync_queue.enqueue("ship", {"order": 1}, dedup_key="ship:1", connection=session)
        assert again.id == shipped.id
        assert _count(database_url) == 1
        with engine.connect() as connection:  # a Core connection works the same way
            sync_queue.enqueue("ship", {"order": 2}, connection=connection)
            connection.rollback()
        assert _count(database_url) == 1
    finally:
        engine.dispose()


def test_bad_input_raises_a_clear_error_and_writes_nothing(sync_queue: SyncQueue, database_url: str) -> None:
    with pytest.raises(InvalidJob, match="run_at: expected a timezone-aware datetime"):
        sync_queue.enqueue("k", run_at=datetime(2030, 1, 1))
    with pytest.raises(InvalidJob, match="payload"):
        sync_queue.enqueue("k", {"bad": object()})  # type: ignore[dict-item]
    with pytest.raises(InvalidJob, match="queue: queue names beginning 'agora:' are agora-pg's own"):
        sync_queue.enqueue("k", queue="agora:pipelines")
    with pytest.raises(TypeError, match="connection must be a DB-API connection"):
        sync_queue.enqueue("k", connection=object())
    assert _count(database_url) == 0


def test_a_lost_connection_is_reported_and_the_next_call_reconnects(
    sync_queue: SyncQueue, database_url: str
) -> None:
    sync_queue.enqueue("k", {"n": 1})
    own_pid = sync_queue._connection.info.backend_pid
    with psycopg.connect(database_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (own_pid,))
    with pytest.raises(DatabaseUnavailable, match="cannot use the database at"):
        sync_queue.enqueue("k", {"n": 2})  # the server ended the session before the insert ran
    job = sync_queue.enqueue("k", {"n": 3})
    assert sync_queue._connection.info.backend_pid != own_pid
    assert _count(database_url) == 2
    assert job.payload == {"n": 3}


def test_an_unreachable_server_or_a_missing_schema_is_one_clear_error(fresh_db: str) -> None:
    with SyncQueue.connect("postgresql://postgres@127.0.0.1:1/nowhere") as queue:
        with pytest.raises(DatabaseUnavailable, match="cannot use the database at postgresql://postgres@127.0.0.1:1"):
            queue.enqueue("k")
    with SyncQueue.connect(fresh_db) as queue:
        with pytest.raises(SchemaNotReady, match="run agora-pg migrate"):
            queue.enqueue("k")


def test_threads_share_one_sync_queue(sync_queue: SyncQueue, database_url: str) -> None:
    ids: list[int] = []
    errors: list[BaseException] = []

    def enqueue_fifty(thread: int) -> None:
        try:
            for index in range(50):
                ids.append(sync_queue.enqueue("k", {"thread": thread, "i": index}).id)
        except BaseException as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=enqueue_fifty, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert len(set(ids)) == 400
    assert _count(database_url) == 400


async def test_sync_code_can_get_wait_for_and_cancel_a_job(sync_queue: SyncQueue, settings: Settings) -> None:
    async def add(job: Job, resources: object) -> dict[str, int]:
        return {"sum": job.payload["a"] + job.payload["b"]}

    summed = sync_queue.enqueue("add", {"a": 2, "b": 3})
    assert sync_queue.get(summed.id) == summed
    with pytest.raises(TimeoutError, match=f"job {summed.id} did not finish within 0.2s \\(it is pending\\)"):
        sync_queue.wait(summed.id, timeout=0.2)  # no worker yet: left as it is
    async with running(Worker({"add": add}, settings=settings)):
        # (a Django view would call it as is; here a thread keeps the worker's loop free)
        assert await asyncio.to_thread(sync_queue.wait, summed.id, timeout=10) == {"sum": 5}
    assert sync_queue.get(summed.id).status is JobStatus.DONE
    waiting = sync_queue.enqueue("add", {"a": 1, "b": 1})
    cancelled = sync_queue.cancel(waiting.id)
    assert cancelled.status is JobStatus.CANCELLED
    with pytest.raises(JobFailed, match=f"job {waiting.id} cancelled"):
        sync_queue.wait(waiting.id, timeout=5)
    with pytest.raises(InvalidTransition):
        sync_queue.cancel(waiting.id)
    with pytest.raises(JobNotFound):
        sync_queue.get(10**12)
