"""Claiming: due jobs only, by priority, SKIP LOCKED, queues, cancel, the claim index."""

import asyncio
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agora_pg import InvalidTransition, JobNotFound, JobSpec, JobStatus, Queue
from agora_pg.db import queries
from agora_pg.db.store import Store


async def test_claims_by_priority_then_run_at(queue: Queue, store: Store) -> None:
    past = datetime.now(UTC) - timedelta(minutes=5)
    low = await queue.enqueue("k", priority=0, run_at=past)
    high_late = await queue.enqueue("k", priority=5)
    high_early = await queue.enqueue("k", priority=5, run_at=past)
    claimed = await store.jobs.claim(["default"], 10, "w", 30, kinds=["k"])
    assert [job.id for job in claimed] == [high_early.id, high_late.id, low.id]
    assert all(job.status is JobStatus.PROCESSING and job.locked_by == "w" for job in claimed)
    assert all(job.attempt == 1 and job.lease_expires_at is not None for job in claimed)


async def test_future_jobs_wait_for_run_at(queue: Queue, store: Store) -> None:
    await queue.enqueue("k", run_at=datetime.now(UTC) + timedelta(hours=1))
    assert await store.jobs.claim(["default"], 10, "w", 30, kinds=["k"]) == []
    promotion = await store.jobs.promote_due(100)
    assert promotion.promoted == 0 and promotion.next_in_seconds is not None
    assert 3590 < promotion.next_in_seconds <= 3600
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET run_at = now() - interval '1 second'")
    assert await store.jobs.claim(["default"], 10, "w", 30, kinds=["k"]) == []  # due, but not promoted yet
    promotion = await store.jobs.promote_due(100)
    assert (promotion.promoted, promotion.next_in_seconds) == (1, None)
    assert len(await store.jobs.claim(["default"], 10, "w", 30, kinds=["k"])) == 1


async def test_claims_only_the_queues_asked_for(queue: Queue, store: Store) -> None:
    await queue.enqueue("k", queue="mail")
    await queue.enqueue("k", queue="reports")
    assert [job.queue for job in await store.jobs.claim(["mail"], 10, "w", 30, kinds=["k"])] == ["mail"]
    assert [job.queue for job in await store.jobs.claim(["mail", "reports"], 10, "w", 30, kinds=["k"])] == ["reports"]


async def test_claim_respects_the_limit(queue: Queue, store: Store) -> None:
    await queue.enqueue_many([JobSpec("k") for _ in range(5)])
    assert len(await store.jobs.claim(["default"], 3, "w", 30, kinds=["k"])) == 3
    assert len(await store.jobs.claim(["default"], 3, "w", 30, kinds=["k"])) == 2


async def test_concurrent_claims_never_share_a_job(queue: Queue, store: Store) -> None:
    await queue.enqueue_many([JobSpec("k") for _ in range(300)])
    stores = [Store.open(store.database) for _ in range(6)]
    try:
        async def drain(own: Store, worker: str) -> list[int]:
            ids: list[int] = []
            while batch := await own.jobs.claim(["default"], 7, worker, 30, kinds=["k"]):
                ids += [job.id for job in batch]
            return ids

        results = await asyncio.gather(*(drain(s, f"w{i}") for i, s in enumerate(stores)))
    finally:
        await asyncio.gather(*(s.close() for s in stores))
    claimed = [job_id for ids in results for job_id in ids]
    assert len(claimed) == 300 == len(set(claimed))


async def test_cancel_a_pending_job(queue: Queue, store: Store) -> None:
    job = await queue.enqueue("k")
    cancelled = await queue.cancel(job.id)
    assert cancelled.status is JobStatus.CANCELLED and cancelled.finished_at is not None
    assert await store.jobs.claim(["default"], 10, "w", 30, kinds=["k"]) == []


async def test_cancel_marks_a_running_job_and_refuses_a_finished_one(queue: Queue, store: Store) -> None:
    job = await queue.enqueue("k")
    [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    asked = await queue.cancel(job.id)
    assert asked.status.value == "processing" and asked.cancel_requested_at is not None
    again = await queue.cancel(job.id)  # asking twice keeps the first request's time
    assert again.cancel_requested_at == asked.cancel_requested_at
    await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w")
    with pytest.raises(InvalidTransition) as caught:
        await queue.cancel(job.id)
    assert (caught.value.from_status, caught.value.to_status) == ("done", "cancelled")
    with pytest.raises(JobNotFound):
        await queue.cancel(999_999)


async def test_claim_queries_read_the_partial_index_in_order(queue: Queue, store: Store) -> None:
    async with store.connection() as connection:
        await connection.execute(
            """
            INSERT INTO agora.jobs (name, kind, status, finished_at)
            SELECT 'old', 'k', 'done', now() FROM generate_series(1, 20000)
            """
        )
        await connection.execute(
            "INSERT INTO agora.jobs (name, kind) SELECT 'new', 'k' FROM generate_series(1, 2000)"
        )
        await connection.execute("ANALYZE agora.jobs")
        await connection.execute(
            f"PREPARE claim(text[], int, text, float8, boolean, int, text[]) AS {queries.CLAIM_JOBS}"
        )
        single = "\n".join(
            r[0] for r in await connection.fetch("EXPLAIN EXECUTE claim(ARRAY['default'], 10, 'w', 30, false, 2, ARRAY['k'])")
        )
        many = "\n".join(r[0] for r in await connection.fetch(
            "EXPLAIN EXECUTE claim(ARRAY['default', 'x'], 10, 'w', 30, true, 2, ARRAY['k', 'other'])"
        ))
    for plan in (single, many):
        assert "jobs_claimable_idx" in plan, plan
        assert "Seq Scan on jobs" not in plan, plan
        # each (queue, kind) reads the index in its order: no sort of the backlog, only of the few rows taken
        assert all("Sort Key: best" in line or "Sort Key: taken" in line
                   for line in plan.splitlines() if "Sort Key" in line), plan


async def test_claim_from_several_queues_takes_the_highest_priority_first(queue: Queue, store: Store) -> None:
    await queue.enqueue("k", queue="mail", priority=1)
    urgent = await queue.enqueue("k", queue="reports", priority=9)
    await queue.enqueue("k", queue="mail", priority=5)
    first = await store.jobs.claim(["mail", "reports"], 1, "w", 30, kinds=["k"])
    assert [job.id for job in first] == [urgent.id]
    rest = await store.jobs.claim(["mail", "reports"], 10, "w", 30, kinds=["k"])
    assert [job.priority for job in rest] == [5, 1]


async def test_completion_probes_the_primary_key_even_with_idle_statistics(queue: Queue, store: Store) -> None:
    async with store.connection() as connection:
        await connection.execute(
            "INSERT INTO agora.jobs (name, kind, status, finished_at) SELECT 'old', 'k', 'done', now() "
            "FROM generate_series(1, 20000)"
        )
        await connection.execute("ANALYZE agora.jobs")  # statistics say: nothing is processing
        await connection.execute("SET plan_cache_mode = force_generic_plan")
        await connection.execute(f"PREPARE done(bigint[], int[], text, text[]) AS {queries.COMPLETE_SUCCEEDED}")
        plan = "\n".join(r[0] for r in await connection.fetch("EXPLAIN EXECUTE done('{1,2}', '{1,1}', 'w', '{NULL,NULL}')"))
        await connection.execute("RESET plan_cache_mode")
    assert "Index Scan using jobs_pkey" in plan, plan
    assert "jobs_lease_idx" not in plan and "jobs_locked_by_idx" not in plan, plan


def _scans_of(node: dict[str, Any], index: str) -> list[dict[str, Any]]:
    """Every scan of ``index`` in the plan ``node``."""
    own = [node] if node.get("Index Name") == index else []
    return own + [scan for child in node.get("Plans", []) for scan in _scans_of(child, index)]


async def _claim_plan(store: Store, kinds: list[str]) -> dict[str, Any]:
    """The executed plan (JSON) of a claim of 10 due jobs of queue default and ``kinds``, rolled back."""
    async with store.connection() as connection:
        await connection.execute("ANALYZE agora.jobs")
        transaction = connection.transaction()
        await transaction.start()
        try:
            [[plan]] = await connection.fetch(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {queries.CLAIM_JOBS}",
                                              ["default"], 10, "w", 30.0, True, 2, kinds)
        finally:
            await transaction.rollback()
    return json.loads(plan)[0]["Plan"]  # type: ignore[no-any-return]


def _claim_index_blocks(root: dict[str, Any], rows: int) -> float:
    """The buffers the claim read of jobs_claimable_idx per (queue, kind) it looked at,
    checking it claimed ``rows`` rows."""
    scans = _scans_of(root, "jobs_claimable_idx")
    assert scans, json.dumps(root)
    assert root["Actual Rows"] == sum(scan["Actual Rows"] * scan["Actual Loops"] for scan in scans) == rows
    blocks = sum(scan["Shared Hit Blocks"] + scan["Shared Read Blocks"] for scan in scans)
    return blocks / sum(scan["Actual Loops"] for scan in scans)


async def test_future_jobs_stay_out_of_the_claims_way(queue: Queue, store: Store) -> None:
    # 100,000 priority-1 jobs due tomorrow and 10 due priority-0 jobs: the claim reads
    # the 10, not the future rows (they wait outside the claim index until due).
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    await queue.enqueue_many([JobSpec("later", priority=1, run_at=tomorrow) for _ in range(100_000)])
    due = await queue.enqueue_many([JobSpec("now") for _ in range(10)])
    blocks = _claim_index_blocks(await _claim_plan(store, ["later", "now"]), len(due))
    assert blocks <= 5, f"the claim read {blocks} buffers of the index per kind for 10 rows"


async def test_jobs_of_kinds_nobody_here_handles_stay_out_of_the_claims_way(queue: Queue, store: Store) -> None:
    # 100,000 due priority-1 jobs of a kind this worker does not handle, ahead of 10 of
    # one it does: the claim reads the 10 (the others wait for a worker of their kind).
    await queue.enqueue_many([JobSpec("elsewhere", priority=1) for _ in range(100_000)])
    due = await queue.enqueue_many([JobSpec("mine") for _ in range(10)])
    blocks = _claim_index_blocks(await _claim_plan(store, ["mine", "absent"]), len(due))
    assert blocks <= 5, f"the claim read {blocks} buffers of the index per kind for 10 rows"
    claimed = await store.jobs.claim(["default"], 100, "w", 30, kinds=["mine"])
    assert sorted(job.id for job in claimed) == sorted(job.id for job in due)
