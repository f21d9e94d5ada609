"""The worker against a real database, in this process."""

import asyncio
import contextlib
import random
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from agora_pg import Job, JobSpec, JobStatus, Queue, Retry, SchemaNotReady, Settings, Worker
from agora_pg.db.job_rows import JobFinish
from agora_pg.db.store import Store
from agora_pg.outcomes import outcome_of
from agora_pg.worker.attempts import Attempt
from agora_pg.worker.completer import Completer
from agora_pg.worker.handlers import KindOptions
from agora_pg.worker.job_rescuer import JobRescuer

from .helpers import running, wait_until


async def job_status(store: Store, job_id: int) -> JobStatus:
    return (await store.jobs.get(job_id)).status


async def runs_of(store: Store, job_id: int) -> list[tuple[int, str, str | None]]:
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT attempt, status, error_message FROM agora.runs WHERE job_id = $1 ORDER BY attempt", job_id
        )
    return [tuple(row) for row in rows]  # type: ignore[misc]


async def test_worker_runs_a_job_to_done_with_resources(queue: Queue, store: Store, settings: Settings) -> None:
    seen: list[tuple[int, Any]] = []

    async def record(job: Job, resources: Any) -> None:
        seen.append((job.id, resources["client"]))

    @contextlib.asynccontextmanager
    async def lifespan() -> AsyncIterator[dict[str, str]]:
        yield {"client": "opened once"}

    job = await queue.enqueue("record", {"x": 1})
    async with running(Worker({"record": record}, lifespan=lifespan, settings=settings)):
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE))
    done = await store.jobs.get(job.id)
    assert seen == [(job.id, "opened once")]
    assert (done.retry_count, done.error_message, done.locked_by, done.lease_expires_at) == (0, None, None, None)
    assert done.finished_at is not None and done.started_at is not None
    assert await runs_of(store, job.id) == [(1, "succeeded", None)]


async def test_a_done_job_shows_no_error_and_its_failed_attempts_runs_keep_theirs(
    queue: Queue, store: Store, settings: Settings
) -> None:
    def flaky(job: Job, resources: Any) -> None:
        if job.attempt == 1:
            raise ValueError("first try")

    job = await queue.enqueue("flaky")
    async with running(Worker({"flaky": flaky}, settings=settings.replace(retry_backoff_seconds=0))):
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE))
    assert (await store.jobs.get(job.id)).error_message is None
    assert await runs_of(store, job.id) == [(1, "failed", "ValueError: first try"), (2, "succeeded", None)]


async def test_a_worker_given_queues_in_code_claims_only_those(queue: Queue, store: Store, settings: Settings) -> None:
    async def noop(job: Job, resources: Any) -> None:
        return None

    mail = await queue.enqueue("noop", {}, queue="mail")
    other = await queue.enqueue("noop", {})
    async with running(Worker({"noop": noop}, settings=settings, queues=["mail"], concurrency=2)):
        await wait_until(lambda: _is(store, mail.id, JobStatus.DONE))
    assert await job_status(store, other.id) is JobStatus.PENDING
    for bad in ("mail", [], [""], [3]):
        with pytest.raises(ValueError, match=r"queues takes a list of queue names, such as \['default', 'mail'\]"):
            Worker({"noop": noop}, queues=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="concurrency must be a whole number >= 1, got 0"):
        Worker({"noop": noop}, concurrency=0)


async def _is(store: Store, job_id: int, status: JobStatus) -> bool:
    return await job_status(store, job_id) is status


def attempt_of(job: Job) -> Attempt:
    """A claimed job as the worker holds it, with no handler."""
    return Attempt(job, None, False, KindOptions(), None)


async def test_an_outcome_written_again_after_a_lost_reply_is_no_takeover(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """A write whose commit landed but whose reply was lost (cut off at shutdown, or by the
    network) is written again and fenced: the outcome is recorded, so no warning that
    another worker took the attempt over; a real takeover still warns."""
    completer = Completer(store, "w", settings, None, random.Random(0))
    done_job, failed_job, taken_job = [await queue.enqueue("k") for _ in range(3)]
    claimed = {job.id: job for job in await store.jobs.claim(["default"], 3, "w", 30, kinds=["k"])}
    assert set(claimed) == {done_job.id, failed_job.id, taken_job.id}
    # the first writes committed (their replies never came back)
    await store.jobs.complete_succeeded([(done_job.id, 1)], "w")
    failure = outcome_of(ValueError("bad"))
    first = Completer(store, "w", settings, None, random.Random(0))
    lost_reply = attempt_of(claimed[failed_job.id])
    lost_reply.outcome = failure
    first.add(lost_reply)
    assert (await first.flush_once()).written == 1
    # the third was taken over: rescued, claimed and finished by another worker
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET status = 'pending', locked_by = NULL, started_at = NULL, "
                                 "lease_expires_at = NULL WHERE id = $1", taken_job.id)
    [again] = await store.jobs.claim(["default"], 1, "other", 30, kinds=["k"])
    await store.jobs.complete_succeeded([(again.id, again.attempt)], "other")
    success = outcome_of(None)
    for job_id, outcome in ((done_job.id, success), (failed_job.id, failure), (taken_job.id, success)):
        attempt = attempt_of(claimed[job_id])
        attempt.outcome = outcome
        completer.add(attempt)
    with caplog.at_level("WARNING", logger="agora_pg"):
        result = await completer.flush_once()
    assert (result.written, result.superseded) == (2, [taken_job.id])
    [warning] = [record.getMessage() for record in caplog.records if "taken over" in record.getMessage()]
    assert f"job {taken_job.id}" in warning or str(taken_job.id) in warning


async def test_retries_to_exhaustion_step_by_step(queue: Queue, store: Store, settings: Settings) -> None:
    policy = settings.replace(retry_backoff_seconds=10)
    completer = Completer(store, "w", policy, None, random.Random(0))
    job = await queue.enqueue("k", max_retries=3)
    for failure in (1, 2, 3):
        [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
        assert claimed.id == job.id and claimed.attempt == failure
        attempt = attempt_of(claimed)
        attempt.outcome = outcome_of(ValueError(f"bad input #{failure}"))
        completer.add(attempt)
        before = datetime.now(UTC)
        await completer.flush_once()
        after = await store.jobs.get(job.id)
        assert after.status is JobStatus.FAILED
        assert after.retry_count == failure
        assert after.error_message == f"ValueError: bad input #{failure}"
        assert after.locked_by is None
        if failure < 3:
            expected_delay = 10 * 2 ** (failure - 1) / 2  # the backoff's jitter halves it at most
            assert after.run_at >= before + timedelta(seconds=expected_delay - 1)
            assert await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"]) == []  # not before its backoff
            async with store.connection() as connection:
                await connection.execute("UPDATE agora.jobs SET run_at = now() WHERE id = $1", job.id)
            assert (await store.jobs.promote_due(10)).promoted == 1  # (a worker's promoter does this)
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET run_at = now() WHERE id = $1", job.id)
        assert await connection.fetchval("SELECT delayed FROM agora.jobs WHERE id = $1", job.id) is False
    assert (await store.jobs.promote_due(10)).promoted == 0
    assert await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"]) == []  # at max_retries: never again
    assert await runs_of(store, job.id) == [
        (1, "failed", "ValueError: bad input #1"),
        (2, "failed", "ValueError: bad input #2"),
        (3, "failed", "ValueError: bad input #3"),
    ]


async def test_worker_retries_a_failing_job_until_max_retries(queue: Queue, store: Store, settings: Settings) -> None:
    async def flaky(job: Job, resources: Any) -> None:
        raise ValueError(f"attempt {job.attempt} failed")

    job = await queue.enqueue("flaky", max_retries=2)
    async with running(Worker({"flaky": flaky}, settings=settings)):
        await wait_until(lambda: _retry_count_is(store, job.id, 2))
    final = await store.jobs.get(job.id)
    assert (final.status, final.retry_count, final.error_message) == (
        JobStatus.FAILED, 2, "ValueError: attempt 2 failed",
    )
    assert [run[1] for run in await runs_of(store, job.id)] == ["failed", "failed"]


async def _retry_count_is(store: Store, job_id: int, count: int) -> bool:
    job = await store.jobs.get(job_id)
    return job.retry_count == count and job.status is JobStatus.FAILED


async def test_null_max_retries_takes_the_worker_setting(store: Store, settings: Settings) -> None:
    async with store.connection() as connection:
        job_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind) VALUES ('plain insert', 'boom') RETURNING id"
        )

    def boom(job: Job, resources: Any) -> None:
        raise RuntimeError("no")

    async with running(Worker({"boom": boom}, settings=settings.replace(max_retries=1))):
        await wait_until(lambda: _retry_count_is(store, job_id, 1))
    final = await store.jobs.get(job_id)
    assert (final.max_retries, final.status) == (1, JobStatus.FAILED)


async def test_handler_chosen_retry_delay(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    async def later(job: Job, resources: Any) -> None:
        raise Retry(3600, "rate limited")

    job = await queue.enqueue("later")
    with caplog.at_level("INFO", logger="agora_pg"):
        async with running(Worker({"later": later}, settings=settings)):
            await wait_until(lambda: _retry_count_is(store, job.id, 1))
    final = await store.jobs.get(job.id)
    assert final.error_message == "Retry: rate limited"
    assert final.run_at > datetime.now(UTC) + timedelta(minutes=59)
    # a planned retry is one line in the log, without a traceback
    [line] = [record for record in caplog.records if "retried" in record.getMessage()]
    assert line.getMessage().endswith("asked to be retried in 3600s: Retry: rate limited")
    assert "Traceback" not in caplog.text


async def test_a_job_of_a_kind_no_worker_handles_waits_for_one_that_does(
    queue: Queue, store: Store, settings: Settings
) -> None:
    waiting = await queue.enqueue("nobody_handles_this", max_retries=0)
    other = await queue.enqueue("other")
    async with running(Worker({"other": lambda job, resources: None}, settings=settings)):
        await wait_until(lambda: _is(store, other.id, JobStatus.DONE))
        [unhandled] = await store.workers.unhandled_jobs()
        assert (unhandled.queue, unhandled.kind, unhandled.jobs) == ("default", "nobody_handles_this", 1)
    job = await store.jobs.get(waiting.id)
    assert (job.status, job.attempt, job.retry_count, job.error_message) == (JobStatus.PENDING, 0, 0, None)
    async with running(Worker({"nobody_handles_this": lambda job, resources: None}, settings=settings)):
        await wait_until(lambda: _is(store, waiting.id, JobStatus.DONE))
        assert await store.workers.unhandled_jobs() == []


async def test_sync_handlers_run_in_a_thread(queue: Queue, store: Store, settings: Settings) -> None:
    threads: list[str] = []

    def blocking(job: Job, resources: Any) -> None:
        threads.append(threading.current_thread().name)

    job = await queue.enqueue("blocking")
    async with running(Worker({"blocking": blocking}, settings=settings)):
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE))
    assert threads and threads[0] != threading.main_thread().name


async def _listening(store: Store) -> bool:
    async with store.connection() as connection:
        return bool(
            await connection.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE 'LISTEN %'"
            )
        )


async def test_notification_wakes_an_idle_worker_at_once(queue: Queue, store: Store, settings: Settings) -> None:
    started = asyncio.Event()

    async def mark(job: Job, resources: Any) -> None:
        started.set()

    async with running(Worker({"mark": mark}, settings=settings.replace(poll_seconds=60))):
        await wait_until(lambda: _listening(store))
        await asyncio.sleep(0.2)  # let the first empty claims pass
        await queue.enqueue("mark")
        await asyncio.wait_for(started.wait(), 5)  # far below the 60 s poll


async def test_a_job_retried_by_hand_wakes_an_idle_worker(queue: Queue, store: Store, settings: Settings) -> None:
    attempts: list[int] = []

    async def fails_once(job: Job, resources: Any) -> None:
        attempts.append(job.attempt)
        if len(attempts) == 1:
            raise ValueError("the first attempt fails")

    async with running(Worker({"fails_once": fails_once}, settings=settings.replace(poll_seconds=60))):
        await wait_until(lambda: _listening(store))
        job = await queue.enqueue("fails_once", max_retries=0)
        await wait_until(lambda: _is(store, job.id, JobStatus.FAILED), timeout=10)
        await asyncio.sleep(0.2)  # the worker is idle, waiting on its 60 s poll
        await store.jobs.retry(job.id)
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE), timeout=10)  # far below the poll
    assert attempts == [1, 2]


async def test_a_delayed_job_and_a_retry_start_when_due_not_at_the_next_poll(
    queue: Queue, store: Store, settings: Settings
) -> None:
    # A delayed job waits outside the claim index; the workers' promotion step, told of
    # it by the insert (and of a retry by its outcome), moves it in when due.
    failures: list[int] = []

    async def flaky(job: Job, resources: Any) -> None:
        if not failures:
            failures.append(job.id)
            raise Retry(1.0, "once more")

    async with running(Worker({"flaky": flaky}, settings=settings.replace(poll_seconds=60))):
        await wait_until(lambda: _listening(store))
        job = await queue.enqueue("flaky", run_at=datetime.now(UTC) + timedelta(seconds=1.5))
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE), timeout=10)  # far below the 60 s poll
    runs = await runs_of(store, job.id)
    assert runs == [(1, "failed", "Retry: once more"), (2, "succeeded", None)]
    async with store.connection() as connection:
        first, second = await connection.fetch(
            "SELECT r.started_at, r.finished_at FROM agora.runs AS r WHERE job_id = $1 ORDER BY attempt", job.id
        )
        created_at = await connection.fetchval("SELECT created_at FROM agora.jobs WHERE id = $1", job.id)
    assert first["started_at"] >= created_at + timedelta(seconds=1.4)  # not before its run_at
    assert second["started_at"] >= first["finished_at"] + timedelta(seconds=0.99)  # nor before its retry's


async def test_without_notifications_polling_alone_runs_jobs(queue: Queue, store: Store, settings: Settings) -> None:
    async def noop(job: Job, resources: Any) -> None:
        return None

    async with running(Worker({"noop": noop}, settings=settings.replace(notifications=False, poll_seconds=0.2))):
        await asyncio.sleep(0.3)
        jobs = [await queue.enqueue("noop") for _ in range(5)]
        for job in jobs:
            await wait_until(lambda job=job: _is(store, job.id, JobStatus.DONE))
        assert not await _listening(store)


async def test_graceful_stop_lets_a_running_job_finish(queue: Queue, store: Store, settings: Settings) -> None:
    async def slow(job: Job, resources: Any) -> None:
        await asyncio.sleep(1.0)

    job = await queue.enqueue("slow")
    worker = Worker({"slow": slow}, settings=settings)
    async with running(worker):
        await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING))
        worker.stop()
    assert await job_status(store, job.id) is JobStatus.DONE


async def test_jobs_past_the_grace_period_are_released_uncounted(
    queue: Queue, store: Store, settings: Settings
) -> None:
    async def stuck(job: Job, resources: Any) -> None:
        await asyncio.sleep(60)

    job = await queue.enqueue("stuck")
    worker = Worker({"stuck": stuck}, settings=settings.replace(shutdown_timeout=0.3))
    async with running(worker, stop_timeout=10):
        await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING))
    released = await store.jobs.get(job.id)
    assert (released.status, released.retry_count, released.locked_by) == (JobStatus.PENDING, 0, None)
    assert [run[:2] for run in await runs_of(store, job.id)] == [(1, "cancelled")]
    assert released.lost_count == 1  # cut short at shutdown: counted apart from failures
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT stopped_at IS NOT NULL FROM agora.workers WHERE id = $1", worker.id)


async def test_lost_worker_job_is_rescued_and_its_late_outcome_is_fenced(queue: Queue, store: Store) -> None:
    job = await queue.enqueue("k")
    [ghost_claim] = await store.jobs.claim(["default"], 1, "ghost", 30, kinds=["k"])
    rescuer = JobRescuer(store, max_lost_attempts=3, default_max_retries=3)
    assert await rescuer.run_once() == []  # lease still valid
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second'")
    assert await rescuer.run_once() == [job.id]
    rescued = await store.jobs.get(job.id)
    assert (rescued.status, rescued.retry_count, rescued.lost_count) == (JobStatus.PENDING, 0, 1)
    assert rescued.error_message is not None and rescued.error_message.startswith("WorkerLost: worker ghost")
    assert await runs_of(store, job.id) == [(1, "abandoned", rescued.error_message)]
    # the ghost's outcome cannot land on the rescued job either
    assert await store.jobs.complete_succeeded([(ghost_claim.id, ghost_claim.attempt)], "ghost") == set()
    assert (await store.jobs.get(job.id)).status is JobStatus.PENDING

    [second_claim] = await store.jobs.claim(["default"], 1, "alive", 30, kinds=["k"])
    assert second_claim.attempt == 2
    # the ghost wakes up: its renewal and its completion must change nothing
    renewal = await store.workers.renew_leases("ghost", 9999, [(ghost_claim.id, ghost_claim.attempt)])
    assert renewal.lost_jobs == {(job.id, ghost_claim.attempt)}
    assert await store.jobs.complete_succeeded([(ghost_claim.id, ghost_claim.attempt)], "ghost") == set()
    current = await store.jobs.get(job.id)
    assert (current.status, current.locked_by, current.attempt) == (JobStatus.PROCESSING, "alive", 2)
    assert current.lease_expires_at == second_claim.lease_expires_at
    assert await store.jobs.complete_succeeded([(second_claim.id, second_claim.attempt)], "alive") == {job.id}
    assert await job_status(store, job.id) is JobStatus.DONE


async def test_running_worker_rescues_jobs_of_a_dead_worker(queue: Queue, store: Store, settings: Settings) -> None:
    async def noop(job: Job, resources: Any) -> None:
        return None

    job = await queue.enqueue("noop")
    await store.jobs.claim(["default"], 1, "dead-worker", 1, kinds=["noop"])  # a one-second lease nobody renews
    async with running(Worker({"noop": noop}, settings=settings.replace(lease_seconds=6))):  # (a rescue round every 0.6 s)
        await wait_until(lambda: _is(store, job.id, JobStatus.DONE), timeout=30)
    assert [run[1] for run in await runs_of(store, job.id)] == ["abandoned", "succeeded"]


async def test_worker_refuses_an_unmigrated_database(fresh_db: str) -> None:
    with pytest.raises(SchemaNotReady, match="run `agora-pg migrate` first"):
        await Worker({}, settings=Settings(database_url=fresh_db)).run(handle_signals=False)


async def test_renewal_skips_rows_being_finished_instead_of_waiting(queue: Queue, store: Store) -> None:
    import asyncpg

    await store.workers.register("w", "host", 1, ["default"])
    await queue.enqueue("k")
    # claimed before the worker's first renewal: the job has a lease of its own
    [claimed] = await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"])
    assert claimed.lease_expires_at is not None
    token = [(claimed.id, claimed.attempt)]
    holder = await asyncpg.connect(store.database.asyncpg_url)
    try:
        async with holder.transaction():
            await holder.execute("SELECT 1 FROM agora.jobs WHERE id = $1 FOR UPDATE", claimed.id)
            # the row is locked (as by an outcome being written): the renewal must not block on
            # it, nor call it lost
            renewal = await asyncio.wait_for(store.workers.renew_leases("w", 60, token), timeout=5)
            assert renewal.lost_jobs == set() and renewal.worker_renewed
    finally:
        await holder.close()
    await store.workers.renew_leases("w", 60, token)  # once free, its lease is folded into the worker's
    async with store.connection() as connection:
        own, worker_lease = await connection.fetchrow(
            "SELECT j.lease_expires_at, w.lease_expires_at FROM agora.jobs AS j, agora.workers AS w "
            "WHERE j.id = $1 AND w.id = 'w'", claimed.id,
        )
    assert own is None and worker_lease > claimed.lease_expires_at
    assert (await store.jobs.get(claimed.id)).lease_expires_at == worker_lease  # read: the worker's lease


async def test_a_slot_stays_taken_until_its_outcome_is_written(
    queue: Queue, store: Store, settings: Settings, database_url: str
) -> None:
    """While outcomes cannot be written (agora.runs is locked), a worker at concurrency 2
    claims no more than 2 jobs, however fast its handlers return: what it holds in memory,
    and what would run again if it died, is bounded by its concurrency."""
    async def quick(_job: Job, _resources: Any) -> None:
        return None

    jobs = await queue.enqueue_many([JobSpec("quick") for _ in range(10)])
    async with _outcomes_blocked(database_url) as unblock:
        async with running(Worker({"quick": quick}, settings=settings.replace(concurrency=2))):
            await wait_until(lambda: _claimed_at_least(store, 2))
            await asyncio.sleep(1.5)  # several poll intervals: time enough to claim more if it would
            assert await _claimed(store) == 2
            await unblock()
            await wait_until(lambda: _all_done(store, [job.id for job in jobs]))


@contextlib.asynccontextmanager
async def _outcomes_blocked(database_url: str) -> AsyncIterator[Callable[[], Awaitable[None]]]:
    """``agora.runs`` locked, so that outcomes wait (claims do not), until the block ends or
    the function it yields is awaited."""
    import asyncpg

    blocker = await asyncpg.connect(database_url)
    try:
        locked = blocker.transaction()
        await locked.start()
        await blocker.execute("LOCK TABLE agora.runs IN EXCLUSIVE MODE")
        yield locked.rollback
    finally:
        await blocker.close()


async def test_a_suspect_counts_as_running_until_its_outcome_is_written(
    queue: Queue, store: Store, settings: Settings, database_url: str
) -> None:
    """Two jobs that lost all but their last attempt ("suspects": one may kill its worker)
    run one at a time per worker, and one whose handler has returned still counts until its
    outcome is written: were its worker killed meanwhile by a job claimed beside it, its
    attempt would be lost with the process and the job failed for good."""
    async def quick(_job: Job, _resources: Any) -> None:
        return None

    jobs = await queue.enqueue_many([JobSpec("quick") for _ in range(2)])
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET lost_count = $1", settings.max_lost_attempts - 1)
    async with _outcomes_blocked(database_url) as unblock:
        async with running(Worker({"quick": quick}, settings=settings.replace(concurrency=4))):
            await wait_until(lambda: _claimed_at_least(store, 1))
            await asyncio.sleep(1.5)  # several poll intervals: time enough to claim the other if it would
            assert await _claimed(store) == 1
            await unblock()
            await wait_until(lambda: _all_done(store, [job.id for job in jobs]))


async def _claimed(store: Store) -> int:
    async with store.connection() as connection:
        return int(await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE attempt > 0"))


async def _claimed_at_least(store: Store, count: int) -> bool:
    return await _claimed(store) >= count


async def _all_done(store: Store, ids: list[int]) -> bool:
    statuses = [await job_status(store, job_id) for job_id in ids]
    return all(status is JobStatus.DONE for status in statuses)


async def test_an_acknowledged_cancel_holds_whatever_becomes_of_the_attempt(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """A cancel asked while the job runs, then: its worker dies (rescue), its attempt is
    lost or cut short at shutdown (outcome), or it is given back unstarted (release).
    Each way, the job ends cancelled: never pending again, never run again."""
    rescued, lost, released, unstarted, failing = [await queue.enqueue("k") for _ in range(5)]
    claimed = {job.id: job for job in await store.jobs.claim(["default"], 5, "w-gone", 30, kinds=["k"])}
    for job in claimed.values():
        assert (await store.jobs.cancel(job.id)).cancel_requested_at is not None  # acknowledged, still running
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
                                 rescued.id)
    assert await store.jobs.rescue_expired(3, 3, 100, lease_seconds=30) == [rescued.id]
    finishes = [JobFinish(lost.id, 1, "lost", "LeaseLost", "LeaseLost: lost", None, 0.0, False),
                JobFinish(released.id, 1, "released", "WorkerShutdown", "WorkerShutdown: stopped", None, 0.0, False),
                JobFinish(failing.id, 1, "failed", "ValueError", "ValueError: raced the cancel", None, 60.0, False)]
    assert await store.jobs.finish(finishes, "w-gone", max_lost_attempts=3, default_max_retries=3) == {
        lost.id, released.id, failing.id}
    assert await store.jobs.release_unstarted("w-gone", []) == {unstarted.id}
    for job_id in (rescued.id, lost.id, released.id, unstarted.id, failing.id):
        job = await store.jobs.get(job_id)
        assert (job.status, job.is_finished) == (JobStatus.CANCELLED, True), (job_id, job.status)
        assert job.finished_at is not None
    assert await store.jobs.claim(["default"], 10, "w2", 30, kinds=["k"]) == []  # nothing to run again
    [run] = await store.runs.of_job(rescued.id)
    assert (run.status, run.error_type) == ("cancelled", "JobCancelled")
    assert (await store.jobs.get(rescued.id)).error_message.startswith("JobCancelled: cancelled on request; WorkerLost")
