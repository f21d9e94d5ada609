"""A batch's outcomes and the worker's next batch in one call (agora.complete_and_claim:
one round trip, one commit): fenced as each is alone, never past the worker's
concurrency, and a lost reply loses nothing."""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import pytest

from agora_pg import Job, JobSpec, JobStatus, Queue, Settings, Worker
from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.migrations.earlier import VERSIONS, migration
from agora_pg.worker.worker import OUTCOMES_CLAIM_UP_TO

from .helpers import serving, wait_until


async def _claim(store: Store, limit: int) -> list[Job]:
    return await store.jobs.claim(["default"], limit, "w", 30, kinds=["k"])


async def test_outcomes_are_recorded_and_the_next_jobs_claimed_in_one_statement(queue: Queue, store: Store) -> None:
    await queue.enqueue_many([JobSpec("k", {"n": n}) for n in range(5)])
    first, second = await _claim(store, 2)
    written, claimed = await store.jobs.complete_and_claim(
        [(first.id, first.attempt), (second.id, second.attempt + 1)], "w", {first.id: '{"ok": 1}'},
        queues=["default"], limit=2, lease_seconds=30, kinds=["k"])
    # the second's attempt is not the one held: fenced, not written; the claim happens all the same
    assert written == {first.id}
    assert [job.payload["n"] for job in claimed] == [2, 3]
    assert all(job.status is JobStatus.PROCESSING and job.locked_by == "w" for job in claimed)
    done = await store.jobs.get(first.id)
    assert (done.status, done.locked_by) == (JobStatus.DONE, None)
    assert (await store.jobs.get(second.id)).status is JobStatus.PROCESSING
    [run] = await store.runs.of_job(first.id)
    assert (run.status, run.result) == ("succeeded", {"ok": 1})


async def test_nothing_to_claim_still_records_the_outcomes(queue: Queue, store: Store) -> None:
    job = await queue.enqueue("k")
    [claimed] = await _claim(store, 1)
    written, more = await store.jobs.complete_and_claim(
        [(claimed.id, claimed.attempt)], "w", {}, queues=["default"], limit=5, lease_seconds=30, kinds=["k"])
    assert (written, more) == ({job.id}, [])
    assert (await store.jobs.get(job.id)).status is JobStatus.DONE


async def test_a_worker_claims_with_its_outcomes_and_never_holds_more_than_its_concurrency(
    queue: Queue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    statements = {"with outcomes": 0}
    complete_and_claim = store.jobs.complete_and_claim

    async def counted(*args: Any, **kwargs: Any) -> Any:
        statements["with outcomes"] += 1
        return await complete_and_claim(*args, **kwargs)

    monkeypatch.setattr(store.jobs, "complete_and_claim", counted)
    held = 0
    peak = 0

    async def handler(job: Job, resources: Any) -> None:
        nonlocal held, peak
        held += 1
        peak = max(peak, held)
        await asyncio.sleep(0.001 * (job.payload["n"] % 3))
        held -= 1

    jobs = await queue.enqueue_many([JobSpec("k", {"n": n}) for n in range(600)])
    async with serving(Worker({"k": handler}), store, settings.replace(concurrency=4)):
        await wait_until(lambda: _all_done(store), timeout=60)
        # (jobs held by the worker in the database: never more than its slots)
        async with store.connection() as connection:
            assert await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE status = 'processing'") == 0
    assert peak <= 4
    assert statements["with outcomes"] > 0  # most batches' next claim came with their outcomes
    runs = await _runs_per_job(store)
    assert runs == {job.id: 1 for job in jobs}


def test_the_latest_migration_of_the_function_creates_the_text_the_code_builds() -> None:
    # (change COMPLETE_SUCCEEDED or CLAIM_JOBS, and a new migration must create the function
    # again, recording the new text's hash: databases migrated before keep the old one)
    recorded = [module.COMPLETE_AND_CLAIM_SHA256 for module in map(migration, sorted(
        path.stem for path in VERSIONS.glob("[0-9]*.py"))) if hasattr(module, "COMPLETE_AND_CLAIM_SHA256")]
    assert recorded, "no migration creates agora.complete_and_claim"
    assert hashlib.sha256(queries.COMPLETE_AND_CLAIM_FUNCTION.encode()).hexdigest() == recorded[-1]


async def test_the_function_in_the_database_is_the_one_the_code_builds(store: Store) -> None:
    async with store.connection() as connection:
        definition = await connection.fetchval(
            "SELECT pg_get_functiondef('agora.complete_and_claim(bigint[], integer[], text, text[], text[], integer, "
            "double precision, boolean, integer, text[])'::regprocedure)")
    body = queries.COMPLETE_AND_CLAIM_FUNCTION.split("$function$")[1]
    assert body in definition


async def test_its_plans_made_on_an_empty_table_read_by_index_once_the_table_has_grown(store: Store) -> None:
    # (its plans are made once per session, before the arguments are known: a plan made
    # while the table was empty must not scan the jobs when they are many)
    plans: list[str] = []
    call = ("SELECT count(*) FROM agora.complete_and_claim($1::bigint[], $2::int[], 'w', $3::text[], "
            "'{default}', 10, 30, true, 2, '{k}')")
    async with store.connection() as connection:
        await connection.execute("INSERT INTO agora.workers (id, hostname, pid) VALUES ('w', 'h', 1)")
        await connection.execute("LOAD 'auto_explain'")
        await connection.execute("SET auto_explain.log_min_duration = 0; SET auto_explain.log_nested_statements = on; "
                                 "SET auto_explain.log_level = notice")
        connection.add_log_listener(lambda _connection, message: plans.append(message.message))
        await connection.fetchval(call, [], [], [])  # (planned on an empty table)
        await connection.execute("INSERT INTO agora.jobs (name, kind) SELECT 'k', 'k' FROM generate_series(1, 20000)")
        plans.clear()
        assert await connection.fetchval(call, [], [], []) == 10
        ids = await connection.fetch("SELECT id, attempt FROM agora.jobs WHERE status = 'processing'")
        assert await connection.fetchval(call, [r["id"] for r in ids], [r["attempt"] for r in ids],
                                         [None] * len(ids)) == 20  # (10 recorded, 10 claimed)
        await connection.execute("SET auto_explain.log_min_duration = -1")
    nested = [plan for plan in plans if "agora.jobs" in plan and "complete_and_claim($1" not in plan]
    assert len(nested) >= 3, plans  # the claim, then the outcomes and the claim
    assert not any("Seq Scan on jobs" in plan for plan in nested), nested


async def test_above_a_hundred_slots_claims_and_outcomes_stay_apart(
    queue: Queue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = []
    complete_and_claim = store.jobs.complete_and_claim

    async def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(kwargs["limit"])
        return await complete_and_claim(*args, **kwargs)

    monkeypatch.setattr(store.jobs, "complete_and_claim", counted)
    await queue.enqueue_many([JobSpec("k", {"n": n}) for n in range(300)])
    async with serving(Worker({"k": _noop}), store, settings.replace(concurrency=OUTCOMES_CLAIM_UP_TO + 1)):
        await wait_until(lambda: _all_done(store), timeout=60)
    assert calls == []  # (the claim loop claims every slot)


async def test_a_lost_reply_to_outcomes_with_a_claim_loses_no_job_and_runs_none_twice(
    queue: Queue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    complete_and_claim = store.jobs.complete_and_claim
    lost: list[list[Job]] = []

    async def lose_the_first_reply(*args: Any, **kwargs: Any) -> Any:
        written, claimed = await complete_and_claim(*args, **kwargs)
        if claimed and not lost:
            lost.append(claimed)
            raise DatabaseUnavailable("connection lost before the reply (simulated)")
        return written, claimed

    monkeypatch.setattr(store.jobs, "complete_and_claim", lose_the_first_reply)
    ran: list[int] = []

    async def handler(job: Job, resources: Any) -> None:
        ran.append(job.id)

    jobs = await queue.enqueue_many([JobSpec("k", {"n": n}) for n in range(40)])
    async with serving(Worker({"k": handler}), store, settings.replace(concurrency=2, lease_seconds=30)):
        await wait_until(lambda: _all_done(store), timeout=20)  # far less than the 30 s lease
    assert lost, "no claim with outcomes lost its reply"
    assert sorted(ran) == sorted(job.id for job in jobs)  # each once: the lost claim's jobs were found
    assert await _runs_per_job(store) == {job.id: 1 for job in jobs}
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT max(lost_count) FROM agora.jobs") == 0


async def _noop(job: Job, resources: Any) -> None:
    return None


async def _all_done(store: Store) -> bool:
    async with store.connection() as connection:
        return not await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE status <> 'done'")


async def _runs_per_job(store: Store) -> dict[int, int]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT job_id, count(*) AS n FROM agora.runs GROUP BY job_id")
    return {row["job_id"]: row["n"] for row in rows}
