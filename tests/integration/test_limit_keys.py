"""Any limit or fair-share key works, however long (agora.limit_key, migration 0027), and
the database refuses limits outside their bounds however they are written."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from agora_pg import Job, Queue, Worker
from agora_pg.db.store import Store
from agora_pg.jobs import JobStatus
from agora_pg.settings import Settings
from agora_pg.worker.handlers import Handlers

from .helpers import running, wait_until
from .test_api import api_client

# Two 10 KB keys that share their first 64 characters: counted apart all the same.
LONG_A = "k" * 64 + "a" * 10_000
LONG_B = "k" * 64 + "b" * 10_000


def _tenants() -> tuple[Handlers, list[str]]:
    handlers = Handlers()
    seen: list[str] = []

    @handlers.kind("report", concurrency=1, limit_by="tenant", rate=(100, 1))
    async def report(job: Job, resources: object) -> None:
        seen.append(job.payload["tenant"])
        await asyncio.sleep(0.05)

    return handlers, seen


async def _statuses(store: Store) -> list[str]:
    async with store.connection() as connection:
        return [row["status"] for row in await connection.fetch("SELECT status FROM agora.jobs ORDER BY id")]


async def test_jobs_with_10_kb_keys_are_enqueued_by_every_producer_and_run(
    store: Store, queue: Queue, settings: Settings
) -> None:
    handlers, seen = _tenants()
    await store.jobs.declare_limits({"report": handlers.options("report").limit()})
    await queue.enqueue("report", {"tenant": LONG_A})
    async with api_client(settings) as client:
        created = await client.post("/jobs", json={"kind": "report", "payload": {"tenant": LONG_B}})
    assert created.status_code == 201, created.text
    async with store.connection() as connection:
        await connection.fetchval("SELECT agora.enqueue('report', $1::jsonb)", f'{{"tenant": "{LONG_A}"}}')
        keys = [row["fair_key"] for row in await connection.fetch("SELECT fair_key FROM agora.jobs ORDER BY id")]
    assert keys[0] == keys[2] != keys[1] and len(keys[0].encode()) < 256 and keys[0].startswith("k" * 64)
    async with running(Worker(handlers, settings=settings)):
        await wait_until(lambda: _all_done(store), what="every job with a long key done")
    assert sorted(seen) == sorted([LONG_A, LONG_B, LONG_A])


async def _all_done(store: Store) -> bool:
    return set(await _statuses(store)) == {JobStatus.DONE.value}


async def test_a_long_key_enqueued_before_its_kind_had_limits_keeps_workers_running(
    store: Store, queue: Queue, settings: Settings
) -> None:
    """The declaration keys the waiting jobs (KEY_WAITING_JOBS): a 10 KB key once made every
    worker declaring the kind exit at start."""
    job = await queue.enqueue("report", {"tenant": LONG_A})
    handlers, seen = _tenants()
    worker = Worker(handlers, settings=settings)
    async with running(worker) as task:
        await wait_until(lambda: _all_done(store), what="the job with a long key done")
        assert not task.done()
    assert seen == [LONG_A] and (await store.jobs.get(job.id)).status is JobStatus.DONE


@pytest.mark.parametrize("values", [
    "('report', 2147483647, NULL, NULL, NULL, NULL)",
    "('report', NULL, NULL, 1, 'NaN', NULL)",
    "('report', NULL, NULL, 1, 'Infinity', NULL)",
    "('report', NULL, NULL, 1, 1e12, NULL)",
    "('report', 1, NULL, NULL, NULL, repeat('f', 201))",
])
async def test_the_database_refuses_limits_out_of_bounds(store: Store, values: str) -> None:
    async with store.connection() as connection:
        with pytest.raises(asyncpg.CheckViolationError, match="kind_limits_within_bounds"):
            await connection.execute("INSERT INTO agora.kind_limits (kind, concurrency, limit_by, rate, rate_seconds, "
                                     f"fair_by) VALUES {values}")
        with pytest.raises(asyncpg.CheckViolationError, match="queue_limits_within_bounds"):
            await connection.execute("INSERT INTO agora.queue_limits (queue, rate, rate_seconds) VALUES ('q', 1, 'NaN')")
