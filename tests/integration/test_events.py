"""Progress reports and the event stream against a real database (worker in this process)."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from agora_pg import Job, JobSpec, JobStatus, Queue, Settings, Worker, job_context
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.events.model import Event, EventFilter, cursor_of
from agora_pg.events.stream import EventStream, Subscription
from agora_pg.runner.adhoc import run_now
from agora_pg.worker import NoJobContext

from .helpers import running, wait_until


async def next_events(events: AsyncIterator[Event], count: int, timeout: float = 10.0) -> list[Event]:
    got: list[Event] = []

    async def take() -> None:
        async for event in events:
            got.append(event)
            if len(got) == count:
                return

    await asyncio.wait_for(take(), timeout)
    return got


async def events_until(events: AsyncIterator[Event], done: Any, timeout: float = 15.0) -> list[Event]:
    """Events until ``done(event)`` is true (that one included)."""
    got: list[Event] = []

    async def take() -> None:
        async for event in events:
            got.append(event)
            if done(event):
                return

    await asyncio.wait_for(take(), timeout)
    return got


def finished(job_id: int) -> Any:
    return lambda event: event.type == "job.finished" and event.data["job_id"] == job_id


async def test_progress_from_async_and_sync_handlers_is_stored_and_kept_with_the_run(
    queue: Queue, store: Store, settings: Settings
) -> None:
    release = threading.Event()

    async def counting(job: Job, _resources: Any) -> None:
        context = job_context()
        assert context.job.id == job.id
        for done in range(1, 4):
            await context.progress(done, 3, f"step {done}")
        while not release.is_set():
            await asyncio.sleep(0.02)

    def copying(job: Job, _resources: Any) -> None:
        job_context().progress(42, None, "bytes copied")  # from the handler's thread, not awaited
        release.wait(10)

    async_job = await queue.enqueue("counting")
    sync_job = await queue.enqueue("copying")
    async with running(Worker({"counting": counting, "copying": copying}, settings=settings)):
        async def reported() -> bool:
            first, second = await store.jobs.get(async_job.id), await store.jobs.get(sync_job.id)
            return (first.progress or {}).get("done") == 3 and (second.progress or {}).get("done") == 42
        await wait_until(reported)
        running_job = await store.jobs.get(async_job.id)
        assert running_job.status is JobStatus.PROCESSING
        assert running_job.progress is not None
        assert (running_job.progress["total"], running_job.progress["message"]) == (3, "step 3")
        assert (await store.jobs.get(sync_job.id)).progress["total"] is None  # type: ignore[index]
        release.set()
        await wait_until(lambda: _all_done(store, [async_job.id, sync_job.id]))
    [run] = await store.runs.of_job(async_job.id)
    assert run.progress is not None and run.progress["done"] == 3


async def _all_done(store: Store, ids: list[int]) -> bool:
    statuses = [(await store.jobs.get(job_id)).status for job_id in ids]
    return all(status is JobStatus.DONE for status in statuses)


async def test_bad_progress_fails_the_handler_call_not_the_worker(queue: Queue, store: Store, settings: Settings) -> None:
    async def bad(job: Job, _resources: Any) -> None:
        await job_context().progress(float("nan"))

    job = await queue.enqueue("bad", max_retries=0)
    async with running(Worker({"bad": bad}, settings=settings)):
        await wait_until(lambda: _failed(store, job.id))
    assert "progress done must be a finite number" in ((await store.jobs.get(job.id)).error_message or "")


async def _failed(store: Store, job_id: int) -> bool:
    return (await store.jobs.get(job_id)).status is JobStatus.FAILED


def test_job_context_outside_a_handler_is_a_clear_error() -> None:
    with pytest.raises(NoJobContext, match="only available while a worker runs a job handler"):
        job_context()


async def test_a_subscriber_sees_a_job_from_enqueue_to_its_end_with_progress(
    queue: Queue, store: Store, settings: Settings
) -> None:
    gate = asyncio.Event()

    async def slow(_job: Job, _resources: Any) -> None:
        await job_context().progress(1, 2, "half")
        await gate.wait()

    stream = EventStream(store)
    try:
        subscription = await stream.subscribe(EventFilter(kind="slow"))
        events = subscription.events()
        job = await queue.enqueue("slow")
        await queue.enqueue("other")  # filtered out
        async with running(Worker({"slow": slow}, settings=settings)):
            seen = await events_until(events, lambda event: event.type == "job.progress")
            gate.set()
            seen += await events_until(events, finished(job.id))
    finally:
        await stream.close()
    types = [event.type for event in seen]
    assert types[0] == "job.enqueued" and types[-1] == "job.finished"
    assert "job.started" in types and types.index("job.started") < types.index("job.progress")
    assert {event.data["job_id"] for event in seen} == {job.id}
    progress = next(event for event in seen if event.type == "job.progress")
    assert progress.data["progress"]["message"] == "half" and progress.data["attempt"] == 1
    end = seen[-1].data
    assert (end["outcome"], end["status"], end["retry_at"], end["progress"]["done"]) == ("succeeded", "done", None, 1)


async def test_a_change_committed_late_is_not_skipped(queue: Queue, store: Store, database_url: str) -> None:
    """A job inserted by a transaction that stays open while the stream reads past its
    timestamp is still sent once it commits (the cursor waits for open transactions)."""
    stream = EventStream(store, poll_seconds=0.05)
    connection = await asyncpg.connect(database_url)
    try:
        subscription = await stream.subscribe()
        events = subscription.events()
        transaction = connection.transaction()
        await transaction.start()
        late_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind) VALUES ('late', 'late') RETURNING id"
        )
        early = await queue.enqueue("early")
        [seen_early] = await next_events(events, 1)
        assert seen_early.data["job_id"] == early.id
        reads = stream.reads
        await wait_until(lambda: _true_after(stream.reads >= reads + 5))
        await transaction.commit()
        [seen_late] = await next_events(events, 1)
        assert (seen_late.type, seen_late.data["job_id"]) == ("job.enqueued", late_id)
    finally:
        await connection.close()
        await stream.close()


async def _true_after(value: bool) -> bool:
    return value


async def test_replay_from_a_cursor_sends_what_was_missed_once(queue: Queue, store: Store, settings: Settings) -> None:
    async def noop(_job: Job, _resources: Any) -> None:
        return None

    async with store.connection() as connection:
        start = await connection.fetchval("SELECT now()")
    jobs = [await queue.enqueue("noop") for _ in range(3)]
    async with running(Worker({"noop": noop}, settings=settings)):
        await wait_until(lambda: _all_done(store, [job.id for job in jobs]))
    stream = EventStream(store)
    try:
        subscription = await stream.subscribe(EventFilter(kind="noop"), since=start)
        batches = subscription.batches()
        replayed: list[Event] = []
        cursor = None
        while len([e for e in replayed if e.type == "job.finished"]) < 3:
            batch = await asyncio.wait_for(anext(batches), 10)
            replayed += [event for event, _body in batch.items]
            cursor = batch.last_cursor
        late = await queue.enqueue("noop")
        live: list[Event] = []
        while not live:
            batch = await asyncio.wait_for(anext(batches), 10)
            live += [event for event, _body in batch.items]
        await batches.aclose()
    finally:
        await stream.close()
    assert sorted(e.data["job_id"] for e in replayed if e.type == "job.enqueued") == [j.id for j in jobs]
    assert len({event.key for event in replayed}) == len(replayed)  # no repeats inside the replay
    assert [e.type for e in replayed if e.data["job_id"] == jobs[0].id] == ["job.enqueued", "job.started", "job.finished"]
    assert [(e.type, e.data["job_id"]) for e in live] == [("job.enqueued", late.id)]  # no replayed event again
    assert cursor is not None and int(cursor) >= int(cursor_of(start))


async def test_cancelled_pending_jobs_and_filters_by_job(queue: Queue, store: Store) -> None:
    stream = EventStream(store)
    try:
        job = await queue.enqueue("never")
        other = await queue.enqueue("never")
        subscription = await stream.subscribe(EventFilter(job_id=job.id), since=job.created_at)
        events = subscription.events()
        await queue.cancel(other.id)
        await queue.cancel(job.id)
        seen = await events_until(events, lambda event: event.type == "job.cancelled")
    finally:
        await stream.close()
    assert [(e.type, e.data["job_id"]) for e in seen] == [("job.enqueued", job.id), ("job.cancelled", job.id)]
    assert seen[-1].data["status"] == "cancelled"


async def test_queue_events_waits_for_a_job_that_already_finished(
    queue: Queue, store: Store, settings: Settings
) -> None:
    async def noop(_job: Job, _resources: Any) -> None:
        return None

    job = await queue.enqueue("noop")
    async with running(Worker({"noop": noop}, settings=settings)):
        await wait_until(lambda: _all_done(store, [job.id]))
    seen = await events_until(queue.events(job_id=job.id, since=job.created_at), finished(job.id))
    assert seen[-1].data["outcome"] == "succeeded"


async def test_a_subscriber_that_falls_behind_is_ended_not_the_stream(queue: Queue, store: Store) -> None:
    stream = EventStream(store, max_pending_events=15)
    try:
        slow = await stream.subscribe()
        keeping_up = await stream.subscribe()
        events = keeping_up.events()
        for _ in range(2):
            await queue.enqueue_many([_spec() for _ in range(10)])
            assert len(await next_events(events, 10)) == 10
        assert slow.overflowed and not keeping_up.overflowed
        assert len([event async for event in slow.events()]) == 10  # what it had queued, then the end
        assert stream.subscribers == 1
    finally:
        await stream.close()


def _spec() -> Any:
    from agora_pg import JobSpec
    return JobSpec("bulk")


async def test_the_stream_survives_the_database_going_away(queue: Queue, store: Store, database_url: str) -> None:
    """Its LISTEN connection and reads are cut; it reconnects and sends what happened meanwhile."""
    stream = EventStream(store, poll_seconds=0.1)
    try:
        subscription: Subscription = await stream.subscribe()
        events = subscription.events()
        first = await queue.enqueue("before")
        assert (await next_events(events, 1))[0].data["job_id"] == first.id
        admin = await asyncpg.connect(database_url)
        try:
            await admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await admin.close()
        second = None
        while second is None:  # (the pooled connections were cut too: a caller tries again)
            try:
                second = await queue.enqueue("after")
            except DatabaseUnavailable:
                await asyncio.sleep(0.05)
        seen = await events_until(events, lambda event: event.data.get("job_id") == second.id, timeout=20)
        assert [e.data["job_id"] for e in seen if e.type == "job.enqueued"] == [second.id]
    finally:
        await stream.close()


async def test_a_subscriber_gets_a_clear_error_when_the_database_is_away() -> None:
    from agora_pg.db.connect import Database

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = Store.open(Database(f"postgresql://postgres@127.0.0.1:{port}/postgres"), timeout=1)
    stream = EventStream(store, start_timeout=1.5)
    try:
        with pytest.raises(DatabaseUnavailable, match="the event stream cannot read the database"):
            await stream.subscribe()
    finally:
        await stream.close()
        await store.close()


async def test_a_pipelines_runs_are_its_job_events(queue: Queue, store: Store, settings: Settings) -> None:
    class Quick:
        async def run(self) -> None:
            return None

    async with store.connection() as connection:
        start = await connection.fetchval("SELECT now()")
    other = await queue.enqueue("noop")
    job = await run_now(store, settings, "nightly", Quick)
    stream = EventStream(store)
    try:
        subscription = await stream.subscribe(EventFilter(pipeline_id="nightly"), since=start)
        batches = subscription.batches()
        got: list[Event] = []
        while not any(event.type == "job.finished" for event in got):
            batch = await asyncio.wait_for(anext(batches), 10)
            got += [event for event, _body in batch.items]
        await batches.aclose()
    finally:
        await stream.close()
    assert {event.data["job_id"] for event in got} == {job.id} != {other.id}
    assert [event.type for event in got] == ["job.enqueued", "job.started", "job.finished"]
    assert (got[-1].data["queue"], got[-1].data["kind"], got[-1].data["outcome"]) == (
        "agora:pipelines", "nightly", "succeeded")


async def test_a_job_that_ends_in_a_millisecond_still_shows_its_start_before_its_end(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """300 jobs of about 1 ms drained by a worker of 10 slots while a subscriber reads:
    each job's job.started arrives, and before its job.finished (a started event was read
    from running jobs only, so a job that ended between two reads had none)."""

    async def quick(_job: Job, _resources: Any) -> None:
        await asyncio.sleep(0.001)

    stream = EventStream(store, min_interval=0.2)  # (reads far apart: most jobs start and end between two)
    try:
        subscription = await stream.subscribe(EventFilter(kind="quick"))
        events = subscription.events()
        jobs = await queue.enqueue_many([JobSpec("quick") for _ in range(300)])
        async with running(Worker({"quick": quick}, settings=settings)):
            ended: set[int] = set()
            seen = await events_until(events, lambda event: event.type == "job.finished"
                                      and (ended.add(event.data["job_id"]) or len(ended) == len(jobs)), timeout=60)
    finally:
        await stream.close()
    for job in jobs:
        mine = [event.type for event in seen if event.data["job_id"] == job.id and event.type != "job.enqueued"]
        assert mine == ["job.started", "job.finished"], (job.id, mine)
