"""The worker lease: one row per worker covers the jobs it runs (agora.workers.lease_expires_at)."""

import asyncio
from typing import Any

from agora_pg import Job, JobStatus, Queue, Settings, Worker
from agora_pg.db.job_rows import JobFinish
from agora_pg.db.store import Store
from agora_pg.worker.job_rescuer import SETTLE_LEASE_SECONDS, JobRescuer

from .helpers import running, wait_until


async def _versions(store: Store, job_ids: list[int]) -> list[str]:
    """Each job row's version (its xmin): an update of the row changes it."""
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT xmin::text FROM agora.jobs WHERE id = ANY($1::bigint[]) ORDER BY id", job_ids
        )
    return [row[0] for row in rows]


async def _worker_lease(store: Store, worker_id: str) -> Any:
    async with store.connection() as connection:
        return await connection.fetchval("SELECT lease_expires_at FROM agora.workers WHERE id = $1", worker_id)


async def _live_worker(store: Store, worker_id: str) -> None:
    """A registered worker whose lease supervisor has renewed once: its worker lease is live."""
    await store.workers.register(worker_id, "host", 1, ["default"])
    assert (await store.workers.renew_leases(worker_id, 30, [])).worker_renewed


async def test_jobs_claimed_under_a_live_worker_lease_have_none_of_their_own(queue: Queue, store: Store) -> None:
    await _live_worker(store, "w")
    for _ in range(3):
        await queue.enqueue("k")
    claimed = await store.jobs.claim(["default"], 3, "w", 30, kinds=["k"])
    assert [job.lease_expires_at for job in claimed] == [None] * 3
    worker_lease = await _worker_lease(store, "w")
    # read back, a running job shows the lease that covers it: its worker's
    assert {(await store.jobs.get(job.id)).lease_expires_at for job in claimed} == {worker_lease}
    assert {job.lease_expires_at for job in await store.jobs.search({}, 10)} == {worker_lease}


async def test_a_renewal_writes_the_workers_row_and_no_job_row(queue: Queue, store: Store) -> None:
    await _live_worker(store, "w")
    for _ in range(5):
        await queue.enqueue("k")
    claimed = await store.jobs.claim(["default"], 5, "w", 30, kinds=["k"])
    ids = [job.id for job in claimed]
    before, lease_before = await _versions(store, ids), await _worker_lease(store, "w")
    renewal = await store.workers.renew_leases("w", 30, [(job.id, job.attempt) for job in claimed])
    assert (renewal.lost_jobs, renewal.cancel_jobs, renewal.unknown_jobs) == (set(), set(), set())
    assert await _versions(store, ids) == before  # not one job row written
    assert await _worker_lease(store, "w") > lease_before


async def test_a_renewal_still_finds_lost_and_cancelled_attempts(queue: Queue, store: Store) -> None:
    await _live_worker(store, "w")
    first, second = await queue.enqueue("k"), await queue.enqueue("k")
    claimed = await store.jobs.claim(["default"], 2, "w", 30, kinds=["k"])
    tokens = [(job.id, job.attempt) for job in claimed]
    await store.jobs.cancel(second.id)
    async with store.connection() as connection:  # the first one is taken from this worker
        await connection.execute("UPDATE agora.jobs SET locked_by = 'other' WHERE id = $1", first.id)
    renewal = await store.workers.renew_leases("w", 30, tokens)
    assert renewal.lost_jobs == {(first.id, 1)}
    assert renewal.cancel_jobs == {(second.id, 1)}


async def test_a_renewal_names_the_jobs_held_unknowingly(queue: Queue, store: Store) -> None:
    await _live_worker(store, "w")
    known, unknown, fresh = [await queue.enqueue("k") for _ in range(3)]
    claimed = {job.id: job for job in await store.jobs.claim(["default"], 3, "w", 30, kinds=["k"])}
    async with store.connection() as connection:  # a claim over a second ago, but the worker lists only one
        await connection.execute(
            "UPDATE agora.jobs SET started_at = now() - interval '5 seconds' WHERE id = ANY($1::bigint[])",
            [known.id, unknown.id],
        )
    renewal = await store.workers.renew_leases("w", 30, [(known.id, claimed[known.id].attempt)])
    # (a claim that just committed may not be held yet: it is not named)
    assert renewal.unknown_jobs == {unknown.id} and fresh.id not in renewal.unknown_jobs


async def test_the_jobs_of_a_worker_whose_lease_passed_are_rescued(queue: Queue, store: Store) -> None:
    await _live_worker(store, "gone")
    await _live_worker(store, "alive")
    await queue.enqueue("k")
    await queue.enqueue("k")
    [claimed] = await store.jobs.claim(["default"], 1, "gone", 30, kinds=["k"])
    [kept] = await store.jobs.claim(["default"], 1, "alive", 30, kinds=["k"])
    rescuer = JobRescuer(store, max_lost_attempts=3, default_max_retries=3)
    assert await rescuer.run_once() == []  # both leases live
    async with store.connection() as connection:
        passed = await connection.fetchval(
            "UPDATE agora.workers SET lease_expires_at = now() - interval '1 second' WHERE id = 'gone' "
            "RETURNING to_char(lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"
        )
    assert await rescuer.run_once() == [claimed.id]
    rescued = await store.jobs.get(claimed.id)
    assert (rescued.status, rescued.lost_count, rescued.locked_by) == (JobStatus.PENDING, 1, None)
    assert rescued.error_message == f"WorkerLost: worker gone stopped renewing its lease, which expired at {passed}"
    assert (await store.jobs.get(kept.id)).status is JobStatus.PROCESSING  # the live worker's job stays
    # the gone worker comes back: its renewal finds the job lost, its late outcome is fenced
    renewal = await store.workers.renew_leases("gone", 30, [(claimed.id, claimed.attempt)])
    assert renewal.lost_jobs == {(claimed.id, claimed.attempt)}
    assert await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "gone") == set()


async def test_a_rescue_does_not_take_a_job_claimed_again_meanwhile(queue: Queue, store: Store) -> None:
    """The rescue locks the attempt it found (same attempt, same worker), not just the row."""
    await _live_worker(store, "gone")
    await _live_worker(store, "alive")
    await queue.enqueue("k")
    [claimed] = await store.jobs.claim(["default"], 1, "gone", 30, kinds=["k"])
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.workers SET lease_expires_at = now() - interval '1 second' "
                                 "WHERE id = 'gone'")
        # the same job, finished and claimed again by a live worker
        await connection.execute("UPDATE agora.jobs SET locked_by = 'alive', attempt = attempt + 1 WHERE id = $1",
                                 claimed.id)
    assert await JobRescuer(store, max_lost_attempts=3, default_max_retries=3).run_once() == []
    assert (await store.jobs.get(claimed.id)).locked_by == "alive"


async def test_a_claim_without_a_live_worker_lease_gives_the_job_its_own(queue: Queue, store: Store) -> None:
    """Before its first renewal, after its lease passed, or unregistered: the job gets a lease
    of its own, which the rescue takes by itself, and which a renewal folds into the worker's."""
    await store.workers.register("w", "host", 1, ["default"])
    await queue.enqueue("k")
    await queue.enqueue("k")
    [before_renewal] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    assert before_renewal.lease_expires_at is not None
    # the first renewal folds it into the worker's lease
    assert (await store.workers.renew_leases("w", 30, [(before_renewal.id, before_renewal.attempt)])).worker_renewed
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.workers SET lease_expires_at = now() - interval '1 second'")
    [after_it_passed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    assert after_it_passed.lease_expires_at is not None
    # the worker's lease passed: the job under it is rescued, the one with its own lease is not yet
    assert await JobRescuer(store, 3, 3).run_once() == [before_renewal.id]
    renewal = await store.workers.renew_leases("w", 30, [(after_it_passed.id, after_it_passed.attempt)])
    assert renewal.lost_jobs == set()
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT lease_expires_at FROM agora.jobs WHERE id = $1",
                                         after_it_passed.id) is None  # folded into the worker's lease


async def test_a_worker_lease_is_let_go_only_once_it_covers_no_job(queue: Queue, store: Store) -> None:
    await _live_worker(store, "gone")
    await _live_worker(store, "idle")
    await queue.enqueue("k")
    await store.jobs.claim(["default"], 1, "gone", 30, kinds=["k"])
    long_ago = f"now() - interval '{SETTLE_LEASE_SECONDS + 60} seconds'"
    async with store.connection() as connection:
        await connection.execute(f"UPDATE agora.workers SET lease_expires_at = {long_ago}, "
                                 f"last_heartbeat_at = now() - interval '30 days'")
    await store.workers.settle_leases(SETTLE_LEASE_SECONDS)
    await store.workers.delete_stale(7 * 24 * 3600)
    async with store.connection() as connection:
        rows = dict(await connection.fetch("SELECT id, lease_expires_at IS NOT NULL FROM agora.workers"))
    assert rows == {"gone": True}  # the idle one is forgotten; the one holding a job stays, lease and all
    rescuer = JobRescuer(store, 3, 3)
    assert len(await rescuer.run_once()) == 1  # (which also lets go of the lease, then forgets the row)
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.workers") == 0


async def test_a_clean_stop_gives_up_the_worker_lease_unless_a_job_is_still_held(
    queue: Queue, store: Store
) -> None:
    await _live_worker(store, "idle")
    await _live_worker(store, "stuck")
    await queue.enqueue("k")
    await store.jobs.claim(["default"], 1, "stuck", 30, kinds=["k"])
    await store.workers.stop("idle")
    await store.workers.stop("stuck")
    assert await _worker_lease(store, "idle") is None
    assert await _worker_lease(store, "stuck") is not None  # it passes, and the job is rescued


async def test_a_worker_runs_a_job_held_in_its_name_that_it_did_not_know_of(store: Store, settings: Settings) -> None:
    """A claim that committed but whose reply was lost: under a live worker lease nothing
    else would take the job back, so the worker's renewal finds it and the worker runs it."""
    seen: list[int] = []

    async def record(job: Job, resources: Any) -> None:
        seen.append(job.id)

    worker = Worker({"record": record}, settings=settings.replace(lease_seconds=3, notifications=False,
                                                                   poll_seconds=60))
    async with running(worker):
        await wait_until(lambda: _has_worker_lease(store, worker.id))
        async with store.connection() as connection:  # the lost claim, as it committed
            job_id = await connection.fetchval(
                "INSERT INTO agora.jobs (name, kind, status, locked_by, attempt, started_at) "
                "VALUES ('record', 'record', 'processing', $1, 1, now() - interval '2 seconds') RETURNING id",
                worker.id,
            )
        await wait_until(lambda: _is_done(store, job_id), timeout=30)
    assert seen == [job_id]
    async with store.connection() as connection:
        runs = await connection.fetch("SELECT attempt, status FROM agora.runs WHERE job_id = $1", job_id)
    assert [tuple(run) for run in runs] == [(1, "succeeded")]


async def _has_worker_lease(store: Store, worker_id: str) -> bool:
    return await _worker_lease(store, worker_id) is not None


async def _is_done(store: Store, job_id: int) -> bool:
    return (await store.jobs.get(job_id)).status is JobStatus.DONE


async def test_a_job_longer_than_many_leases_runs_once_under_the_worker_lease(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """Jobs claimed between two renewals, and before the first one, keep running: the
    worker's lease covers them all, and each renewal moves their fences on."""
    async def slow(job: Job, resources: Any) -> None:
        await asyncio.sleep(10)

    # (leases of 3 s, renewed every second, an attempt stopped after 2.25 s without a
    # renewal: each job outlives three of them, and a busy machine's stall of 2 s is survived)
    worker = Worker({"slow": slow}, settings=settings.replace(lease_seconds=3, concurrency=4))
    jobs = [await queue.enqueue("slow")]
    async with running(worker):
        for _ in range(3):  # claimed at different points of the renewal cycle
            await asyncio.sleep(0.25)
            jobs.append(await queue.enqueue("slow"))
        for job in jobs:
            await wait_until(lambda job=job: _is_done(store, job.id), timeout=60)  # type: ignore[misc]
    async with store.connection() as connection:
        runs = await connection.fetch(
            "SELECT job_id, status FROM agora.runs WHERE job_id = ANY($1::bigint[]) ORDER BY job_id",
            [job.id for job in jobs],
        )
    assert [tuple(run) for run in runs] == [(job.id, "succeeded") for job in jobs]


async def test_a_worker_whose_row_was_deleted_renews_leases_of_the_jobs_own(queue: Queue, store: Store) -> None:
    await _live_worker(store, "w")
    await queue.enqueue("k")
    [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    assert claimed.lease_expires_at is None
    async with store.connection() as connection:
        await connection.execute("DELETE FROM agora.workers WHERE id = 'w'")  # by hand
    renewal = await store.workers.renew_leases("w", 30, [(claimed.id, claimed.attempt)])
    assert not renewal.worker_renewed and renewal.lost_jobs == set()
    first = (await store.jobs.get(claimed.id)).lease_expires_at
    assert first is not None  # a lease of its own now, which the next renewal extends
    await store.workers.renew_leases("w", 30, [(claimed.id, claimed.attempt)])
    assert (await store.jobs.get(claimed.id)).lease_expires_at > first  # type: ignore[operator]


async def test_running_jobs_no_worker_lease_can_cover_get_a_lease_and_are_rescued(queue: Queue, store: Store) -> None:
    """A dead worker's row deleted by hand: its jobs, under its worker lease, are not stranded."""
    await _live_worker(store, "gone")
    await queue.enqueue("k")
    [claimed] = await store.jobs.claim(["default"], 1, "gone", 30, kinds=["k"])
    async with store.connection() as connection:
        await connection.execute("DELETE FROM agora.workers WHERE id = 'gone'")
    rescuer = JobRescuer(store, 3, 3, lease_seconds=0.5)
    assert await rescuer.run_once() == []  # (the job gets a lease of its own: 0.5 s)
    assert (await store.jobs.get(claimed.id)).lease_expires_at is not None
    await asyncio.sleep(0.6)
    assert await rescuer.run_once() == [claimed.id]
    assert (await store.jobs.get(claimed.id)).status is JobStatus.PENDING


async def test_the_rescue_looks_up_only_the_jobs_of_workers_whose_lease_passed(store: Store) -> None:
    """Many running jobs under live leases, one dead worker: a nested loop over the dead
    worker's index entries, not a scan of every running job (the rescue runs every few
    seconds on every worker)."""
    from agora_pg.db import queries

    async with store.connection() as connection:
        await connection.execute(
            "INSERT INTO agora.workers (id, hostname, pid, queues, lease_expires_at) "
            "SELECT 'w' || n, 'h', n, '{default}', now() + interval '30 seconds' FROM generate_series(1, 40) AS n"
        )
        await connection.execute(
            "INSERT INTO agora.workers (id, hostname, pid, queues, lease_expires_at) "
            "VALUES ('dead', 'h', 0, '{default}', now() - interval '1 minute')"
        )
        await connection.execute(
            "INSERT INTO agora.jobs (name, kind, status, locked_by, attempt, started_at) "
            "SELECT 'b', 'k', 'processing', 'w' || (1 + n % 40), 1, now() FROM generate_series(1, 20000) AS n"
        )
        await connection.execute("ANALYZE agora.jobs")
        await connection.execute("ANALYZE agora.workers")
        plan = "\n".join(row[0] for row in await connection.fetch(f"EXPLAIN {queries.RESCUE_EXPIRED}", 1000, 3, 3, 30.0))
    lookup = plan.split("CTE lost_on_their_own")[0]  # how the dead workers' jobs are found
    assert "Nested Loop" in lookup and "Index Cond: (locked_by = w.id)" in lookup, plan
    assert "Seq Scan on jobs" not in lookup and "Hash Join" not in lookup, plan


async def test_a_renewal_just_after_an_outcome_was_written_does_not_call_it_lost(queue: Queue, store: Store) -> None:
    """The outcome has committed but the completer has not let go of the lease yet."""
    await _live_worker(store, "w")
    await queue.enqueue("k")
    await queue.enqueue("k")
    done, failed = await store.jobs.claim(["default"], 2, "w", 30, kinds=["k"])
    assert await store.jobs.complete_succeeded([(done.id, done.attempt)], "w") == {done.id}
    finish = JobFinish(failed.id, failed.attempt, "failed", "ValueError", "ValueError: no", None, 5.0, False)
    assert await store.jobs.finish([finish], "w", 3, 3) == {failed.id}
    renewal = await store.workers.renew_leases("w", 30, [(done.id, done.attempt), (failed.id, failed.attempt)])
    assert renewal.lost_jobs == set()
