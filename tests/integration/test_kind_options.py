"""A kind's options live in the database (agora.kinds): its workers declare them, and
every producer applies them, whatever it knows of the kind's code."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from agora_pg import Handlers, Job, Queue, SyncQueue, Worker
from agora_pg.db.job_rows import DeclaredKind
from agora_pg.db.store import Store
from agora_pg.settings import Settings

from .helpers import record_failure, serving, wait_until
from .test_api import api_client

# The README tour's kind, with a queue of its own besides.
handlers = Handlers()


@handlers.kind("send_email", max_retries=5, timeout=30, queue="emails")
async def send_email(job: Job, resources: object) -> dict[str, str]:
    return {"sent_to": job.payload["to"]}


README = DeclaredKind(queue="emails", max_retries=5, timeout_seconds=30.0)


@contextlib.asynccontextmanager
async def declared_by_a_worker(store: Store, settings: Settings) -> AsyncIterator[Worker]:
    """A worker of the tour's handlers, serving (it declared its kinds when it started)."""
    worker = Worker(handlers)
    async with serving(worker, store, settings.replace(queues=("emails",))):
        await wait_until(lambda: _declared(store, worker.id), what="the worker's declaration of send_email")
        yield worker


async def _declared(store: Store, worker_id: str) -> bool:
    async with store.connection() as connection:
        return bool(await connection.fetchval(
            "SELECT count(*) FROM agora.kinds WHERE kind = 'send_email' AND declared_by = $1", worker_id))


async def _options(store: Store, job_id: int) -> tuple[str, int | None, float | None]:
    async with store.connection() as connection:
        row = await connection.fetchrow("SELECT queue, max_retries, timeout_seconds FROM agora.jobs WHERE id = $1",
                                        job_id)
    return row["queue"], row["max_retries"], row["timeout_seconds"]


async def test_a_queue_that_knows_no_handlers_applies_the_declared_options(
    store: Store, settings: Settings, database_url: str
) -> None:
    async with declared_by_a_worker(store, settings) as worker:
        async with Queue.connect(database_url=database_url) as queue:
            job = await queue.enqueue("send_email", {"to": "ada@example.com"})
            own = await queue.enqueue("send_email", {"to": "bo@example.com"}, queue="emails", max_retries=1)
        assert (job.queue, job.max_retries, job.timeout_seconds) == ("emails", 5, 30.0)
        assert await _options(store, job.id) == ("emails", 5, 30.0)
        assert await _options(store, own.id) == ("emails", 1, 30.0)  # a value set on the job wins
        await wait_until(lambda: _done(store, job.id), what="the worker ran the job")
        assert worker.kind_options["send_email"].declared() == README


async def _done(store: Store, job_id: int) -> bool:
    return (await store.jobs.get(job_id)).status.value == "done"


async def test_a_batch_applies_each_kinds_options_in_order(store: Store, settings: Settings, database_url: str) -> None:
    from agora_pg import JobSpec

    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})
    async with Queue.connect(database_url=database_url) as queue:
        jobs = await queue.enqueue_many([JobSpec("other", {"i": 0}), JobSpec("send_email", {"i": 1}),
                                         JobSpec("send_email", {"i": 2}, max_retries=0, timeout_seconds=2)])
    assert [(job.queue, job.max_retries, job.timeout_seconds) for job in jobs] == [
        ("default", None, None), ("emails", 5, 30.0), ("emails", 0, 2.0)]
    for job in jobs:
        assert await store.jobs.get(job.id) == job


async def test_a_sync_queue_applies_the_declared_options(store: Store, settings: Settings, database_url: str) -> None:
    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})

    def enqueue() -> Job:
        with SyncQueue.connect(database_url, settings) as queue:
            return queue.enqueue("send_email", {"to": "ada@example.com"})

    job = await asyncio.to_thread(enqueue)
    assert (job.queue, job.max_retries, job.timeout_seconds) == ("emails", 5, 30.0)
    assert await _options(store, job.id) == ("emails", 5, 30.0)


async def test_post_jobs_on_an_api_without_the_module_applies_the_declared_options(
    store: Store, settings: Settings
) -> None:
    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})
    async with api_client(settings) as client:
        created = await client.post("/jobs", json={"kind": "send_email", "payload": {"to": "ada@example.com"}})
    assert created.status_code == 201, created.text
    body = created.json()
    assert (body["queue"], body["max_retries"], body["timeout_seconds"]) == ("emails", 5, 30.0)
    assert await _options(store, body["id"]) == ("emails", 5, 30.0)


async def test_the_cli_submit_applies_the_declared_options(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from agora_pg.cli import main

    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    assert await asyncio.to_thread(main, ["jobs", "submit", "send_email", "--payload", '{"to": "a@b.c"}']) == 0
    async with store.connection() as connection:
        job_id = await connection.fetchval("SELECT max(id) FROM agora.jobs WHERE kind = 'send_email'")
    assert await _options(store, job_id) == ("emails", 5, 30.0)
    assert "emails" in capsys.readouterr().out


async def test_plain_sql_enqueues_with_the_declared_options(store: Store) -> None:
    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})
    async with store.connection() as connection:
        job_id = await connection.fetchval("""SELECT agora.enqueue('send_email', '{"to": "ada@example.com"}')""")
        keyed = await connection.fetchval("SELECT agora.enqueue('send_email', dedup_key => 'welcome:ada')")
        again = await connection.fetchval("SELECT agora.enqueue('send_email', dedup_key => 'welcome:ada')")
        elsewhere = await connection.fetchval("SELECT agora.enqueue('send_email', queue => 'urgent')")
        unknown = await connection.fetchval("SELECT agora.enqueue('not_declared')")
        with pytest.raises(asyncpg.InvalidParameterValueError, match="agora-pg's own"):
            await connection.fetchval("SELECT agora.enqueue('send_email', queue => 'agora:pipelines')")
    assert await _options(store, job_id) == ("emails", 5, 30.0)
    assert keyed is not None and again is None  # (a live job holds the key)
    assert await _options(store, elsewhere) == ("urgent", 5, 30.0)
    assert await _options(store, unknown) == ("default", None, None)


async def test_a_bare_insert_takes_the_kinds_max_retries_at_its_first_failure(store: Store) -> None:
    """A job inserted by plain SQL (or before any worker declared its kind) names no
    max_retries: its first failure takes the kind's, not the worker's default (3)."""
    async with store.connection() as connection:
        job_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind, queue) VALUES ('x', 'send_email', 'emails') RETURNING id")
    await store.workers.register("w1", "host", 1, ["emails"], ["send_email"])
    await store.workers.declare_kinds("w1", {"send_email": README})
    for _attempt in range(4):  # more failures than the worker's default allows
        [claimed] = await store.jobs.claim(["emails"], 1, "w1", 30, kinds=["send_email"])
        assert await record_failure(store, job_id, claimed.attempt, "w1", "SMTPError: down") == {job_id}
    job = await store.jobs.get(job_id)
    assert (job.status.value, job.retry_count, job.max_retries) == ("failed", 4, 5)  # one retry left


async def test_workers_that_disagree_about_a_kind_are_reported_and_the_latest_wins(
    store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    await store.workers.register("old", "host", 1, ["emails"], ["send_email"])
    assert await store.workers.declare_kinds("old", {"send_email": DeclaredKind(max_retries=2)}) == []
    with caplog.at_level(logging.WARNING, logger="agora_pg.worker"):
        async with declared_by_a_worker(store, settings) as worker:
            [conflict] = await store.workers.kind_conflicts()
            assert (conflict.kind, conflict.worker_id, conflict.declared_by) == ("send_email", "old", worker.id)
            assert (conflict.declares, conflict.holds) == (DeclaredKind(max_retries=2), README)
            async with api_client(settings) as client:
                page = (await client.get("/ui/fragments/overview")).text
            assert "Workers that disagree about a kind" in page and "max_retries=2" in page
    warnings = [record.getMessage() for record in caplog.records if "send_email" in record.getMessage()]
    assert any("live worker old declared max_retries=2" in message for message in warnings), warnings
    await store.workers.stop("old")  # a stopped worker disagrees with nobody
    assert await store.workers.kind_conflicts() == []
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT max_retries FROM agora.kinds WHERE kind = 'send_email'") == 5


async def test_a_declaration_lost_with_the_database_is_made_again_by_the_workers_retry(
    store: Store, settings: Settings
) -> None:
    """The worker's registration (the declaration among it) is retried while the database is
    away: every backend is terminated while it starts, and its kinds are declared all the same."""
    async with store.connection() as killer:
        worker = Worker(handlers)
        async with serving(worker, store, settings.replace(queues=("emails",))):
            for _ in range(3):
                await killer.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                      "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                await asyncio.sleep(0.05)
            await wait_until(lambda: _declared(store, worker.id), what="the declaration, after the kills")
    async with store.connection() as connection:
        row = await connection.fetchrow("SELECT queue, max_retries, timeout_seconds, declared_by FROM agora.kinds")
    assert tuple(row) == ("emails", 5, 30.0, worker.id)
