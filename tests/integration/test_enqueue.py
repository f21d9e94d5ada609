"""Enqueue: defaults, batches, plain SQL inserts, dedup keys, the caller's transaction."""

import asyncio
import dataclasses
from datetime import UTC, datetime, timedelta, timezone

import asyncpg
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

from agora_pg import InvalidJob, Job, JobSpec, JobStatus, Queue
from agora_pg.db.store import Store


async def test_enqueue_stores_a_pending_job_with_defaults(queue: Queue) -> None:
    job = await queue.enqueue("send_email", payload={"to": "a@b.c"})
    assert job.id > 0
    assert (job.name, job.kind, job.queue, job.status) == ("send_email", "send_email", "default", JobStatus.PENDING)
    assert job.payload == {"to": "a@b.c"}
    assert (job.priority, job.retry_count, job.max_retries, job.attempt) == (0, 0, None, 0)  # (its kind's, else the worker's)
    assert job.error_message is None and job.locked_by is None
    assert job.run_at <= datetime.now(UTC) + timedelta(seconds=1)
    assert await queue.get(job.id) == job


async def test_enqueue_keeps_every_argument(queue: Queue) -> None:
    when = datetime(2031, 5, 4, 3, 2, 1, tzinfo=UTC)
    job = await queue.enqueue(
        "report", {"n": 1}, name="monthly report", queue="reports", priority=7, run_at=when,
        max_retries=9, dedup_key="report-2031-05",
    )
    assert (job.name, job.queue, job.priority, job.run_at, job.max_retries, job.dedup_key) == (
        "monthly report", "reports", 7, when, 9, "report-2031-05",
    )


async def test_enqueue_many_returns_jobs_in_the_order_given(queue: Queue) -> None:
    specs = [JobSpec("k", {"i": i}, priority=i % 3) for i in range(50)]
    jobs = await queue.enqueue_many(specs)
    assert [job.payload["i"] for job in jobs] == list(range(50))
    assert len({job.id for job in jobs}) == 50


async def test_enqueue_many_stores_every_argument_as_get_reads_it(queue: Queue) -> None:
    berlin = timezone(timedelta(hours=1))
    specs = [
        JobSpec("k", {"nested": {"list": [1, 2.5, None, "\u00e9"]}}),
        JobSpec("k", name="named job", queue="q2", priority=-4, run_at=datetime(2031, 5, 4, 3, 2, 1, 7, tzinfo=berlin),
                max_retries=0, dedup_key="key 1"),
        JobSpec("other"),
    ]
    jobs = await queue.enqueue_many(specs)
    assert [job.max_retries for job in jobs] == [None, 0, None]  # unset: the kind's, else the worker's
    assert jobs[1].run_at == datetime(2031, 5, 4, 2, 2, 1, 7, tzinfo=UTC)
    for job in jobs:
        stored = await queue.get(job.id)
        assert stored == job
        assert set(vars(stored)) == {field.name for field in dataclasses.fields(Job)}


async def test_invalid_enqueue_raises_and_writes_nothing(queue: Queue, store: Store) -> None:
    with pytest.raises(InvalidJob, match="payload"):
        await queue.enqueue("k", payload=["not", "an", "object"])  # type: ignore[arg-type]
    with pytest.raises(InvalidJob, match="run_at"):
        await queue.enqueue("k", run_at=datetime(2030, 1, 1))
    with pytest.raises(InvalidJob, match="queue: queue names beginning 'agora:' are agora-pg's own"):
        await queue.enqueue_many([JobSpec("k"), JobSpec("k", queue="agora:pipelines")])
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs") == 0


async def test_plain_sql_insert_gets_every_default(store: Store) -> None:
    async with store.connection() as connection:
        job_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind, payload) VALUES ($1, $2, $3::jsonb) RETURNING id",
            "from psql", "echo", '{"a": 1}',
        )
    job = await store.jobs.get(job_id)
    assert (job.status, job.queue, job.priority, job.retry_count, job.max_retries) == (
        JobStatus.PENDING, "default", 0, 0, None,
    )
    claimed = await store.jobs.claim(["default"], 10, "w", 30, kinds=["echo"])
    assert [j.id for j in claimed] == [job_id]


async def test_database_rejects_a_non_object_payload(store: Store) -> None:
    async with store.connection() as connection:
        with pytest.raises(asyncpg.CheckViolationError):
            await connection.execute("INSERT INTO agora.jobs (name, kind, payload) VALUES ('n', 'k', '[1]')")


async def test_dedup_key_returns_the_live_job(queue: Queue, store: Store) -> None:
    first = await queue.enqueue("k", {"v": 1}, dedup_key="same")
    second = await queue.enqueue("k", {"v": 2}, dedup_key="same")
    assert second == first
    # a processing job still blocks the key
    [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    assert (await queue.enqueue("k", dedup_key="same")).id == first.id
    # once finished, the key is free again
    await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w")
    third = await queue.enqueue("k", {"v": 3}, dedup_key="same")
    assert third.id != first.id and third.payload == {"v": 3}


async def test_dedup_within_one_batch(queue: Queue, store: Store) -> None:
    jobs = await queue.enqueue_many([JobSpec("k", dedup_key="a"), JobSpec("k"), JobSpec("k", dedup_key="a")])
    assert jobs[0].id == jobs[2].id != jobs[1].id
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs") == 2


@pytest.mark.connections(44)
async def test_dedup_under_concurrent_enqueues_keeps_one_job(database_url: str, store: Store) -> None:
    queues = [Queue(Store.open(store.database)) for _ in range(8)]
    try:
        results = await asyncio.gather(
            *(q.enqueue("k", {"from": i}, dedup_key="race") for i, q in enumerate(queues) for _ in range(5))
        )
    finally:
        await asyncio.gather(*(q.store.close() for q in queues))
    assert len({job.id for job in results}) == 1
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE dedup_key = 'race'") == 1


async def test_enqueue_in_callers_asyncpg_transaction(queue: Queue, database_url: str, store: Store) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        with pytest.raises(RuntimeError):
            async with connection.transaction():
                await queue.enqueue("k", {"rolled": "back"}, connection=connection)
                raise RuntimeError("caller fails")
        async with connection.transaction():
            kept = await queue.enqueue("k", {"committed": True}, connection=connection)
    finally:
        await connection.close()
    async with store.connection() as own:
        rows = await own.fetch("SELECT id FROM agora.jobs")
    assert [row["id"] for row in rows] == [kept.id]


async def test_enqueue_in_callers_sqlalchemy_connection_and_session(queue: Queue, store: Store) -> None:
    engine = create_async_engine(store.database.sqlalchemy_url)
    try:
        async with engine.connect() as connection:
            async with connection.begin():
                await queue.enqueue("k", {"via": "connection"}, connection=connection)
                await connection.rollback()
        async with AsyncSession(engine) as session:
            async with session.begin():
                await session.execute(text("SELECT 1"))
                kept = await queue.enqueue("k", {"via": "session"}, connection=session)
        async with AsyncSession(engine) as session:
            await session.begin()
            await queue.enqueue_many([JobSpec("k", {"via": "rolled back session"})], connection=session)
            await session.rollback()
    finally:
        await engine.dispose()
    async with store.connection() as own:
        payloads = [row["payload"] for row in await own.fetch("SELECT payload::text AS payload FROM agora.jobs")]
    assert payloads == ['{"via": "session"}']
    assert (await store.jobs.get(kept.id)).payload == {"via": "session"}


async def test_enqueue_rejects_unknown_connection_types(queue: Queue) -> None:
    with pytest.raises(TypeError, match="asyncpg connection or a SQLAlchemy"):
        await queue.enqueue("k", connection=object())  # type: ignore[arg-type]


async def test_inserts_wake_workers_only_for_jobs_due_now(queue: Queue, database_url: str) -> None:
    # A delayed job wakes the promotion steps (agora_delayed), not the claim loops.
    listener = await asyncpg.connect(database_url)
    heard: list[tuple[str, str]] = []
    try:
        for channel in ("agora_jobs", "agora_delayed"):
            await listener.add_listener(channel, lambda _c, _p, channel_, payload: heard.append((channel_, payload)))
        await queue.enqueue("k", queue="later", run_at=datetime.now(UTC) + timedelta(hours=1))
        await queue.enqueue_many([JobSpec("k", queue="later", run_at=datetime.now(UTC) + timedelta(hours=1))] * 2)
        await queue.enqueue("k", queue="now")
        await queue.enqueue_many([JobSpec("k", queue="soon"), JobSpec("k", queue="mixed", run_at=datetime.now(UTC) + timedelta(hours=1))])
        for _ in range(50):
            if len(heard) >= 5:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.1)
    finally:
        await listener.close()
    assert sorted(heard) == sorted(
        [("agora_delayed", ""), ("agora_delayed", ""), ("agora_jobs", "now"), ("agora_jobs", "soon"), ("agora_delayed", "")]
    )
