"""The worker's failure paths, in this process against a real database: a claim whose
reply is lost, handlers that misbehave (raise CancelledError, poison text, hang),
timeouts, cancelling running jobs, errors that must not be retried, tracebacks,
lost attempts counted apart, and a job that comes back to the same worker."""

from __future__ import annotations

import asyncio
import logging
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import pytest

from agora_pg import Fail, Handlers, Job, JobSpec, JobStatus, Queue, Retry, Settings, Worker
from agora_pg.db.store import Store
from agora_pg.db.connect import Database
from agora_pg.errors import ConnectionLost, DatabaseUnavailable
from agora_pg.runtime.process import check_schema
from agora_pg.worker.job_rescuer import JobRescuer

from .helpers import running, serving, wait_until


async def job_runs(store: Store, job_id: int) -> list[tuple[Any, ...]]:
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT attempt, status, error_type, traceback FROM agora.runs WHERE job_id = $1 ORDER BY attempt, id",
            job_id,
        )
    return [tuple(row) for row in rows]


async def finished(store: Store, job_id: int) -> bool:
    return (await store.jobs.get(job_id)).is_finished


async def test_a_claim_whose_reply_was_lost_is_run_by_the_worker_that_holds_it(
    queue: Queue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []

    async def record(job: Job, resources: Any) -> None:
        ran.append(job.attempt)

    claim = store.jobs.claim
    lost = []

    async def claim_then_lose_the_reply(*args: Any, **kwargs: Any) -> list[Job]:
        jobs = await claim(*args, **kwargs)
        if jobs and not lost:
            lost.append(jobs)
            raise DatabaseUnavailable("connection lost before the reply (simulated)")
        return jobs

    monkeypatch.setattr(store.jobs, "claim", claim_then_lose_the_reply)
    job = await queue.enqueue("record")
    async with serving(Worker({"record": record}), store, settings.replace(lease_seconds=30)):
        await wait_until(lambda: finished(store, job.id), timeout=10)  # far less than the 30 s lease
    assert lost and ran == [1]
    done = await store.jobs.get(job.id)
    assert (done.status, done.lost_count, done.attempt) == (JobStatus.DONE, 0, 1)
    assert [run[:2] for run in await job_runs(store, job.id)] == [(1, "succeeded")]


async def test_a_handler_raising_cancelled_error_itself_is_a_recorded_failure(
    queue: Queue, store: Store, settings: Settings
) -> None:
    async def awaits_a_cancelled_task(job: Job, resources: Any) -> None:
        task = asyncio.create_task(asyncio.sleep(10))
        task.cancel()
        await task

    job = await queue.enqueue("self_cancel", max_retries=1)
    async with running(Worker({"self_cancel": awaits_a_cancelled_task}, settings=settings)):
        await wait_until(lambda: finished(store, job.id))
    failed = await store.jobs.get(job.id)
    assert (failed.status, failed.retry_count, failed.locked_by) == (JobStatus.FAILED, 1, None)
    assert failed.error_message is not None and failed.error_message.startswith("CancelledError: the handler raised")
    [(attempt, status, error_type, traceback)] = await job_runs(store, job.id)
    assert (attempt, status, error_type) == (1, "failed", "CancelledError") and traceback


async def test_poison_error_text_is_stored_and_the_worker_keeps_running(
    queue: Queue, store: Store, settings: Settings
) -> None:
    async def poison(job: Job, resources: Any) -> None:
        kind = job.payload["poison"]
        if kind == "nul":
            raise ValueError("bad \x00 byte")
        if kind == "surrogate":
            raise ValueError("bad \udc80 text")
        if kind == "infinite_retry":
            raise Retry(float("inf"), "never \x00 again")
        raise RuntimeError("x" * 100_000)

    async def fine(job: Job, resources: Any) -> None:
        return None

    poisoned = [await queue.enqueue("poison", {"poison": kind}, max_retries=2 if kind == "infinite_retry" else 1)
                for kind in ("nul", "surrogate", "infinite_retry", "huge")]
    good = [await queue.enqueue("fine") for _ in range(20)]
    worker = Worker({"poison": poison, "fine": fine}, settings=settings)
    async with running(worker) as task:
        for job in poisoned + good:
            await wait_until(lambda job=job: _recorded(store, job.id))
        assert not task.done()  # the worker is still up
    messages = {job.payload["poison"]: (await store.jobs.get(job.id)).error_message for job in poisoned}
    assert messages["nul"] == "ValueError: bad \\x00 byte"
    assert messages["surrogate"] == "ValueError: bad \\udc80 text"
    assert messages["infinite_retry"] == "Retry: never \\x00 again"
    assert messages["huge"] is not None and len(messages["huge"]) == 4000
    retried = await store.jobs.get(poisoned[2].id)
    assert retried.status is JobStatus.FAILED and retried.run_at > datetime.now(UTC) + timedelta(days=300)
    assert [(await store.jobs.get(job.id)).status for job in good] == [JobStatus.DONE] * len(good)


async def _recorded(store: Store, job_id: int) -> bool:
    return bool(await job_runs(store, job_id))


async def test_an_outcome_statement_failing_on_its_data_fails_only_that_outcome(
    queue: Queue, store: Store, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Even if a batch of outcomes is refused for its data, the others are written one by one."""
    finish_jobs = store.jobs.finish
    refused: list[int] = []

    async def refuse_batches_holding_poison(finishes: Any, *args: Any) -> set[int]:
        if any("POISON" in (finish.error_message or "") for finish in finishes):
            refused.append(len(finishes))
            import asyncpg

            raise asyncpg.CharacterNotInRepertoireError("invalid byte sequence (simulated)")
        return await finish_jobs(finishes, *args)

    monkeypatch.setattr(store.jobs, "finish", refuse_batches_holding_poison)

    async def fails(job: Job, resources: Any) -> None:
        raise ValueError(job.payload["text"])

    jobs = [await queue.enqueue("fails", {"text": text}, max_retries=1) for text in ("plain", "POISON", "other")]
    async with serving(Worker({"fails": fails}), store, settings):
        for job in jobs:
            await wait_until(lambda job=job: _recorded(store, job.id))
    stored = {job.payload["text"]: await store.jobs.get(job.id) for job in jobs}
    assert refused
    assert stored["plain"].error_message == "ValueError: plain"
    assert stored["other"].error_message == "ValueError: other"
    poisoned = stored["POISON"]
    assert poisoned.status is JobStatus.FAILED and poisoned.error_message is not None
    assert poisoned.error_message.startswith("OutcomeNotStorable: the attempt's outcome (failed, ValueError)")


# -- timeouts -------------------------------------------------------------------------


async def test_timeouts_per_job_per_kind_and_by_default(queue: Queue, store: Store, settings: Settings) -> None:
    cleaned_up: list[int] = []
    handlers = Handlers()

    @handlers.kind("hangs_by_kind", timeout=0.3)
    async def hangs_by_kind(job: Job, resources: Any) -> None:
        await asyncio.sleep(60)

    @handlers.kind("hangs")
    async def hangs(job: Job, resources: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cleaned_up.append(job.id)
            raise

    by_job = await queue.enqueue("hangs", timeout_seconds=0.3, max_retries=2)
    by_kind = await queue.enqueue("hangs_by_kind", max_retries=1)
    by_default = await queue.enqueue("hangs", max_retries=1)
    async with running(Worker(handlers, settings=settings.replace(job_timeout=0.5))):
        for job in (by_job, by_kind, by_default):  # (each handler would sleep 60 s: only its timeout ends it)
            await wait_until(lambda job=job: finished(store, job.id), timeout=30, what=f"job {job.id} finished")
    for job in (by_job, by_kind, by_default):
        final = await store.jobs.get(job.id)
        assert final.status is JobStatus.FAILED
        assert final.error_message is not None and final.error_message.startswith("JobTimeout: the attempt ran longer")
    assert [run[:3] for run in await job_runs(store, by_job.id)] == [
        (1, "failed", "JobTimeout"), (2, "failed", "JobTimeout"),
    ]  # retried by the usual policy
    assert "0.3s" in ((await store.jobs.get(by_job.id)).error_message or "")
    assert by_job.id in cleaned_up  # the handler saw CancelledError


async def test_a_timed_out_sync_handler_keeps_its_job_until_its_thread_returns(
    queue: Queue, store: Store, settings: Settings
) -> None:
    release = threading.Event()
    threads_running = []

    def blocking(job: Job, resources: Any) -> None:
        threads_running.append(job.id)
        release.wait(30)

    job = await queue.enqueue("blocking", timeout_seconds=0.2, max_retries=1)
    async with running(Worker({"blocking": blocking}, settings=settings)):
        await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING))
        await asyncio.sleep(1.0)  # well past the timeout: the thread still runs
        held = await store.jobs.get(job.id)
        assert held.status is JobStatus.PROCESSING and held.locked_by is not None  # not released: no second run
        release.set()
        await wait_until(lambda: finished(store, job.id))
    final = await store.jobs.get(job.id)
    assert (final.status, final.retry_count) == (JobStatus.FAILED, 1)
    assert final.error_message is not None and final.error_message.startswith("JobTimeout")
    assert threads_running == [job.id]


async def _is(store: Store, job_id: int, status: JobStatus) -> bool:
    return (await store.jobs.get(job_id)).status is status


# -- cancelling a running job --------------------------------------------------------


@pytest.mark.parametrize("notifications", [True, False])
async def test_cancelling_a_running_async_job_stops_it_and_it_is_not_retried(
    queue: Queue, store: Store, settings: Settings, notifications: bool
) -> None:
    saw_cancel = asyncio.Event()

    async def long(job: Job, resources: Any) -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            saw_cancel.set()  # the handler's clean-up runs
            raise

    job = await queue.enqueue("long", max_retries=3)
    # Without notifications, the lease renewal (every lease/3) carries the request. With
    # them, renewals come only every 40 s, the first 40 s after the worker starts: a cancel
    # seen before then came by its notification (no elapsed time is asserted).
    lease = 120 if notifications else 9
    worker_settings = settings.replace(notifications=notifications, lease_seconds=lease)
    started = asyncio.get_running_loop().time()
    async with running(Worker({"long": long}, settings=worker_settings)):
        await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING), timeout=30)
        assert (await queue.cancel(job.id)).cancel_requested_at is not None
        first_renewal = started + lease / 3
        await wait_until(lambda: _is(store, job.id, JobStatus.CANCELLED),
                         timeout=max(first_renewal - 1 - asyncio.get_running_loop().time(), 0) if notifications else 30,
                         what="the job cancelled " + ("by its notification, before the first lease renewal"
                                                      if notifications else "by a lease renewal"))
    assert saw_cancel.is_set()
    cancelled = await store.jobs.get(job.id)
    assert (cancelled.retry_count, cancelled.locked_by, cancelled.cancel_requested_at) == (0, None, None)
    assert [run[:3] for run in await job_runs(store, job.id)] == [(1, "cancelled", "JobCancelled")]
    await asyncio.sleep(0.5)
    assert (await store.jobs.get(job.id)).status is JobStatus.CANCELLED  # not claimed again


async def test_a_cancel_whose_notification_was_missed_is_found_when_listen_reconnects(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """A worker that was not listening when a cancel was asked for (its LISTEN connection
    down, or not yet up when the job started) looks at its running jobs' rows once it
    listens again: the cancel comes then, not at the next lease renewal (40 s here)."""
    async def long(job: Job, resources: Any) -> None:
        await asyncio.sleep(60)

    job = await queue.enqueue("long")
    async with running(Worker({"long": long}, settings=settings.replace(lease_seconds=120))):
        await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING), timeout=30)
        async with store.connection() as connection:  # the cancel, its notification lost
            await connection.execute("UPDATE agora.jobs SET cancel_requested_at = now() WHERE id = $1", job.id)
            terminated = await connection.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = current_database() AND query LIKE 'LISTEN%'")
        assert terminated == 1
        await wait_until(lambda: _is(store, job.id, JobStatus.CANCELLED), timeout=20,
                         what="the job cancelled once LISTEN reconnected")
    assert [run[:2] for run in await job_runs(store, job.id)] == [(1, "cancelled")]


async def test_cancelling_a_running_sync_job_waits_for_its_thread(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    release = threading.Event()

    def blocking(job: Job, resources: Any) -> None:
        release.wait(30)

    async def worker_waits_for_the_thread() -> bool:
        return any("cannot be interrupted" in record.getMessage() for record in caplog.records)

    job = await queue.enqueue("blocking")
    with caplog.at_level(logging.WARNING, logger="agora_pg.worker"):
        async with running(Worker({"blocking": blocking}, settings=settings)):
            await wait_until(lambda: _is(store, job.id, JobStatus.PROCESSING))
            await queue.cancel(job.id)
            # The worker learns of the cancel by NOTIFY, or by its next lease renewal when
            # the claim came before its LISTEN (a job enqueued before the worker started).
            await wait_until(worker_waits_for_the_thread, timeout=30)
            await asyncio.sleep(0.2)
            assert (await store.jobs.get(job.id)).status is JobStatus.PROCESSING  # the thread still runs
            release.set()
            await wait_until(lambda: _is(store, job.id, JobStatus.CANCELLED))
    assert [run[:2] for run in await job_runs(store, job.id)] == [(1, "cancelled")]


# -- errors that must not be retried, and tracebacks ------------------------------------


async def test_fail_and_non_retryable_types_end_the_job_at_once(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    handlers = Handlers()

    @handlers.kind("card", non_retryable=(KeyError,))
    async def card(job: Job, resources: Any) -> None:
        if job.payload["how"] == "fail":
            raise Fail("card declined")
        raise KeyError("no such customer")

    failing = [await queue.enqueue("card", {"how": how}, max_retries=5) for how in ("fail", "key")]
    with caplog.at_level(logging.WARNING, logger="agora_pg.worker"):
        async with running(Worker(handlers, settings=settings)):
            for job in failing:
                await wait_until(lambda job=job: finished(store, job.id))
    for job, message in zip(failing, ("Fail: card declined", "KeyError: 'no such customer'"), strict=True):
        final = await store.jobs.get(job.id)
        assert (final.status, final.retry_count, final.max_retries, final.error_message) == (
            JobStatus.FAILED, 1, 1, message,
        )
        [(attempt, status, error_type, traceback)] = await job_runs(store, job.id)
        assert status == "failed" and traceback is not None
        assert "in card\n" in traceback and traceback.rstrip().endswith(message)
    logged = [record.getMessage() for record in caplog.records if record.levelno == logging.WARNING]
    [fail_line] = [line for line in logged if f"job {failing[0].id} (kind 'card'" in line]
    assert fail_line.endswith("failed: Fail: card declined")  # intended: one line, its traceback in the run
    assert any(f"job {failing[1].id} (kind 'card'" in line and "Traceback" in line for line in logged)


# -- lost attempts ----------------------------------------------------------------------


async def test_lost_attempts_count_apart_from_failures_up_to_their_own_limit(queue: Queue, store: Store) -> None:
    job = await queue.enqueue("k", max_retries=5)
    rescuer = JobRescuer(store, max_lost_attempts=2, default_max_retries=3)
    for lost in (1, 2):
        [claimed] = await store.jobs.claim(["default"], 1, f"dies-{lost}", 30, kinds=["k"])
        async with store.connection() as connection:
            await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second'")
        assert await rescuer.run_once() == [job.id]
        after = await store.jobs.get(job.id)
        assert (after.lost_count, after.retry_count) == (lost, 0)
    assert after.status is JobStatus.FAILED and after.is_finished
    assert after.error_message is not None and after.error_message.endswith("(2 lost attempts: not retried)")
    assert await store.jobs.claim(["default"], 1, "w", 30, kinds=["k"]) == []
    assert [run[1] for run in await job_runs(store, job.id)] == ["abandoned", "abandoned"]


async def test_a_job_back_at_the_same_worker_is_tracked_per_attempt(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """The first attempt's clean-up must not forget the second attempt of the same job."""
    first_running = asyncio.Event()

    async def hangs(job: Job, resources: Any) -> None:
        if job.attempt == 1:
            first_running.set()
            try:
                await asyncio.sleep(60)
            finally:
                await asyncio.sleep(0.3)  # the first attempt's clean-up ends after the second started
        await asyncio.sleep(60)

    job = await queue.enqueue("hangs")
    worker = Worker({"hangs": hangs}, settings=settings.replace(shutdown_timeout=0.2))
    async with running(worker):
        await first_running.wait()

        async def rescued() -> bool:
            """Its lease expires and it is rescued (by this rescuer or the worker's own, whichever
            comes first; a renewal in between puts the lease back, so expire it again)."""
            async with store.connection() as connection:
                await connection.execute(
                    "UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' "
                    "WHERE id = $1 AND status = 'processing' AND attempt = 1", job.id,
                )
            await JobRescuer(store, 3, 3).run_once()
            return (await store.jobs.get(job.id)).lost_count == 1

        await wait_until(rescued)
        await wait_until(lambda: _attempt_is(store, job.id, 2))  # claimed again by the same worker
        await asyncio.sleep(1.0)
    final = await store.jobs.get(job.id)
    # the second attempt was still tracked, so the stop released it
    assert (final.status, final.locked_by, final.attempt) == (JobStatus.PENDING, None, 2)
    assert [run[:2] for run in await job_runs(store, job.id)] == [(1, "abandoned"), (2, "cancelled")]


async def _attempt_is(store: Store, job_id: int, attempt: int) -> bool:
    job = await store.jobs.get(job_id)
    return job.attempt == attempt and job.status is JobStatus.PROCESSING


async def test_a_worker_runs_one_job_with_lost_attempts_at_a_time(queue: Queue, store: Store, settings: Settings) -> None:
    """A job that lost attempts may be what kills workers: it never runs beside another such job."""
    suspects = [await queue.enqueue("tracked", {"suspect": True}) for _ in range(3)]
    plain = [await queue.enqueue("tracked", {"suspect": False}) for _ in range(5)]
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE agora.jobs SET lost_count = 1 WHERE id = ANY($1::bigint[])", [job.id for job in suspects]
        )  # with at most 2 lost attempts, one makes a suspect (one below the most it may lose)
    running_suspects: list[int] = []
    most = 0

    async def tracked(job: Job, resources: Any) -> None:
        nonlocal most
        if job.payload["suspect"]:
            running_suspects.append(job.id)
            most = max(most, len(running_suspects))
            await asyncio.sleep(0.3)
            running_suspects.remove(job.id)

    async with running(Worker({"tracked": tracked}, settings=settings.replace(concurrency=10, max_lost_attempts=2))):
        for job in suspects + plain:
            await wait_until(lambda job=job: finished(store, job.id))
    assert most == 1
    for job in suspects:
        done = await store.jobs.get(job.id)
        assert (done.status, done.lost_count) == (JobStatus.DONE, 1)  # given back uncounted while another ran


async def test_jobs_behind_a_crowd_of_suspects_run_beside_the_one_suspect(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """After a kill storm the head of the queue is jobs with lost attempts: a worker runs
    one of them at a time, and the jobs behind them beside it, without claiming suspects
    only to give them back."""
    suspects = await queue.enqueue_many([JobSpec("tracked", {"suspect": True}) for _ in range(20)])
    plain = await queue.enqueue_many([JobSpec("tracked", {"suspect": False}) for _ in range(20)])
    async with store.connection() as connection:
        await connection.execute(
            "UPDATE agora.jobs SET lost_count = 2 WHERE id = ANY($1::bigint[])", [job.id for job in suspects])
    finished_suspects = running_suspects = most_at_once = 0

    async def tracked(job: Job, resources: Any) -> None:
        nonlocal finished_suspects, running_suspects, most_at_once
        if job.payload["suspect"]:
            running_suspects += 1
            most_at_once = max(most_at_once, running_suspects)
            await asyncio.sleep(0.3)
            running_suspects -= 1
            finished_suspects += 1

    caplog.set_level(logging.INFO, logger="agora_pg.worker")
    async with running(Worker({"tracked": tracked}, settings=settings.replace(concurrency=10))):
        for job in plain:
            await wait_until(lambda job=job: finished(store, job.id), timeout=10)
        suspects_by_then = finished_suspects
        for job in suspects:
            await wait_until(lambda job=job: finished(store, job.id), timeout=30)
    assert suspects_by_then <= 3, suspects_by_then  # the plain jobs did not wait for the suspects
    assert not [r for r in caplog.records if "gave back" in r.getMessage()]
    assert most_at_once == 1


async def test_a_job_that_lost_one_attempt_of_three_is_no_suspect(queue: Queue, store: Store, settings: Settings) -> None:
    """A single lost attempt is ordinary (a deploy, a lost node): with the default three,
    such jobs run side by side at full speed after a storm of kills."""
    jobs = await queue.enqueue_many([JobSpec("tracked") for _ in range(6)])
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET lost_count = 1 WHERE id = ANY($1::bigint[])", [j.id for j in jobs])
    at_once = 0
    most = 0

    async def tracked(job: Job, resources: Any) -> None:
        nonlocal at_once, most
        at_once += 1
        most = max(most, at_once)
        await asyncio.sleep(0.3)
        at_once -= 1

    assert settings.max_lost_attempts == 3
    async with running(Worker({"tracked": tracked}, settings=settings.replace(concurrency=10))):
        for job in jobs:
            await wait_until(lambda job=job: finished(store, job.id))
    assert most == 6


async def _terminated_mid_call(store: Store, database_url: str) -> None:
    """Run a statement on one of ``store``'s connections and end its session meanwhile."""
    async def terminate_soon() -> None:
        killer = await asyncpg.connect(database_url)
        try:
            for _ in range(100):
                if await killer.fetchval(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query = 'SELECT pg_sleep(30)' AND state = 'active'"
                ):
                    return
                await asyncio.sleep(0.05)
        finally:
            await killer.close()

    terminator = asyncio.create_task(terminate_soon())
    try:
        async with store.connection() as connection:
            await connection.execute("SELECT pg_sleep(30)")
    finally:
        await terminator


async def test_the_start_up_schema_check_outlives_a_terminated_session_but_not_an_unreachable_server(
    store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConnectionLost):  # a session ended under a call: the server was there
        await _terminated_mid_call(store, database_url)
    real_schema_versions = store.schema_versions
    calls = 0

    async def first_call_terminated() -> set[str]:
        nonlocal calls
        calls += 1
        if calls == 1:
            await _terminated_mid_call(store, database_url)
        return await real_schema_versions()

    monkeypatch.setattr(store, "schema_versions", first_call_terminated)
    with pytest.raises(ConnectionLost):
        await check_schema(store, attempts=1)
    calls = 0
    await check_schema(store)  # tried again on a fresh connection: passes
    assert calls == 2
    unreachable = Store.open(Database("postgresql://postgres@127.0.0.1:1/nowhere"), timeout=5)
    tries = 0
    real_unreachable_versions = unreachable.schema_versions

    async def counted() -> set[str]:
        nonlocal tries
        tries += 1
        return await real_unreachable_versions()

    monkeypatch.setattr(unreachable, "schema_versions", counted)
    try:
        with pytest.raises(DatabaseUnavailable) as raised:
            await check_schema(unreachable)
        assert not isinstance(raised.value, ConnectionLost)
        assert tries == 1  # not retried: a wrong URL fails the start at once
    finally:
        await unreachable.close()
