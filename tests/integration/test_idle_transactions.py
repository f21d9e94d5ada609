"""A session of agora-pg's left idle inside a transaction (its process frozen or cut off
in the middle of a claim) is ended by the server, so its locks go with it; a claim that
does not answer is cancelled."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import ConnectionLost, DatabaseUnavailable
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job
from agora_pg.limits import QueueLimit
from agora_pg.settings import Settings
from agora_pg.worker.worker import Worker

from .helpers import running, wait_until


async def test_a_transaction_left_idle_loses_its_locks_to_the_servers_timeout(database_url: str) -> None:
    frozen = Store.open(Database(database_url, idle_transaction_timeout=0.5))
    other = await asyncpg.connect(database_url)
    try:
        with pytest.raises(ConnectionLost):
            async with frozen.connection() as connection, connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock(42)")
                await connection.fetchval("SELECT 1 FROM agora.workers FOR UPDATE")
                await asyncio.sleep(1.5)  # frozen: the server ends the session meanwhile
                await connection.fetchval("SELECT 1")
        started = time.monotonic()
        assert await other.fetchval("SELECT pg_try_advisory_lock(42)")  # free: no wait
        assert time.monotonic() - started < 1
    finally:
        await other.close()
        await frozen.close()


async def test_the_timeout_is_the_settings_and_never_more_than_half_a_lease(database_url: str) -> None:
    cases = [(Settings(), "10s"), (Settings(idle_transaction_timeout=3), "3s"),
             (Settings(lease_seconds=4), "2s")]
    for settings, shown in cases:
        store = Store.open(Database.from_settings(settings, database_url))
        try:
            async with store.connection() as connection:
                assert await connection.fetchval("SHOW idle_in_transaction_session_timeout") == shown
        finally:
            await store.close()
    pooled = Store.open(Database(database_url, transaction_pooling=True))
    try:
        async with pooled.connection() as connection:  # (a transaction pooler has its own)
            assert await connection.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await pooled.close()


async def test_a_claim_past_its_deadline_is_cancelled_and_claims_nothing(store: Store, database_url: str) -> None:
    await store.jobs.declare_queue_limits({"limited": QueueLimit(5)})
    await store.jobs.enqueue([JobSpec("k", queue=name) for name in ("default", "limited")])
    blocker = await asyncpg.connect(database_url)
    try:
        async with blocker.transaction():  # (an operator's ALTER TABLE: the claims wait behind it)
            await blocker.execute("LOCK TABLE agora.jobs IN ACCESS EXCLUSIVE MODE")
            for claim in (store.jobs.claim(["default"], 5, "w", 30, kinds=["k"], timeout=0.3),
                          store.jobs.claim_limited(["limited"], 5, "w", 30, ["k"], scan=100, timeout=0.3)):
                started = time.monotonic()
                with pytest.raises(DatabaseUnavailable, match="deadline"):
                    await claim
                assert time.monotonic() - started < 3
        assert await blocker.fetchval("SELECT count(*) FROM agora.jobs WHERE status = 'processing'") == 0
        assert [job.queue for job in await store.jobs.claim(["default"], 5, "w", 30, kinds=["k"])] == ["default"]
        jobs, _ = await store.jobs.claim_limited(["limited"], 5, "w", 30, ["k"], scan=100)
        assert [job.queue for job in jobs] == ["limited"]
    finally:
        await blocker.close()


async def test_a_worker_cancels_claims_stuck_behind_a_lock_and_runs_the_jobs_after(
    store: Store, settings: Settings, database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    ran: list[int] = []

    async def handler(job: Job, resources: object) -> None:
        ran.append(job.id)

    worker = Worker({"k": handler}, settings=settings.replace(claim_timeout=0.3, poll_seconds=0.1))
    blocker = await asyncpg.connect(database_url)
    try:
        async with running(worker):
            await wait_until(lambda: _registered(store, worker.id))
            async with blocker.transaction():
                await blocker.execute("LOCK TABLE agora.jobs IN ACCESS EXCLUSIVE MODE")
                await wait_until(lambda: _logged(caplog, "no answer within the call's deadline"), timeout=10)
            [job] = [job for job, _ in await store.jobs.enqueue([JobSpec("k")])]
            await wait_until(lambda: _done(store, job.id), timeout=10)
            assert ran == [job.id]
    finally:
        await blocker.close()


async def _registered(store: Store, worker_id: str) -> bool:
    return bool(await store.fetch("SELECT 1 FROM agora.workers WHERE id = $1", worker_id))


async def _logged(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return any(text in record.getMessage() for record in caplog.records)


async def _done(store: Store, job_id: int) -> bool:
    return (await store.jobs.get(job_id)).status.value == "done"
