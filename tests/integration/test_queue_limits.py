"""Concurrency limits per queue: at most N running jobs of a queue (of every kind) across
every worker, counted by the database at claim time under a lock of the queue's limit row."""

import asyncio
import itertools
from typing import Any

import pytest

from agora_pg import Job, JobSpec, Queue, Worker
from agora_pg.db.store import Store
from agora_pg.errors import InvalidJob
from agora_pg.limits import KindLimit, QueueLimit
from agora_pg.settings import Settings
from agora_pg.worker.handlers import Handlers

from .helpers import drain_by_claimers, running, wait_until
from .test_api import api_client


async def _queue_limits(store: Store) -> dict[str, tuple[int | None, str]]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT queue, concurrency, declared_in FROM agora.queue_limits")
    return {row["queue"]: (row["concurrency"], row["declared_in"]) for row in rows}


async def _running_in(store: Store, queue: str) -> int:
    async with store.connection() as connection:
        return int(await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE status = 'processing' AND queue = $1", queue))


async def _claimed(store: Store, queue: str, limit: int, worker: str, **options: Any) -> list[int]:
    """The jobs a worker of every kind these tests enqueue claims."""
    jobs, _ = await store.jobs.claim_limited([queue], limit, worker, 30, ["a", "b", "bulk", "note", "r", "s"], scan=100,
                                             **options)
    return [job.id for job in jobs]


def test_handlers_queue_checks_its_limit() -> None:
    handlers = Handlers()
    handlers.queue("mail", concurrency=3)
    handlers.queue("sms", rate=(10, 1))
    handlers.queue("old")
    assert handlers.queue_limits() == {"mail": QueueLimit(3), "sms": QueueLimit(None, (10, 1.0)),
                                       "old": QueueLimit()}
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match=r"concurrency: expected a whole number from 1 to 1,000,000, .*\(queue 'mail'\)"):
            handlers.queue("mail", concurrency=bad)  # type: ignore[arg-type]
    for rate in ((0, 60), (1, 0), "10/s", (1, 2, 3), (1, float("nan")), (1, float("inf")), (1, 1e12)):
        with pytest.raises(ValueError, match=r"rate: expected \(starts, seconds\) .*\(queue 'mail'\)"):
            handlers.queue("mail", rate=rate)  # type: ignore[arg-type]
    for name, problem in (("", "must not be empty"), (" ", "must not be empty"), ("mail\x1b[2J", "must not contain"),
                          ("m" * 10_000, "longer than 100"), ("agora:pipelines", "are agora-pg's own")):
        with pytest.raises(InvalidJob, match=f"^queue: .*{problem}.* \\(queue '.*'\\)$"):
            handlers.queue(name, concurrency=1)


async def test_declared_queue_limits_are_written_changed_removed_and_the_config_wins(store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": QueueLimit(3), "reports": QueueLimit(1), "plain": QueueLimit(),
                                           "sms": QueueLimit(None, (10, 1.0))})
    assert await _queue_limits(store) == {"mail": (3, "code"), "reports": (1, "code"), "sms": (None, "code")}
    assert await store.jobs.limited_queues(["mail", "sms", "default"]) == {
        "mail": QueueLimit(3), "sms": QueueLimit(None, (10, 1.0))}
    await store.jobs.declare_queue_limits({"mail": QueueLimit(5, (100, 60)), "reports": QueueLimit(),
                                           "sms": QueueLimit()})
    assert await store.jobs.limited_queues(None) == {"mail": QueueLimit(5, (100, 60.0))}
    # a config's declaration wins; a worker's, with a limit or without, leaves it alone
    assert await store.jobs.declare_queue_limits({"mail": QueueLimit(1), "reports": QueueLimit(2)}, config=True) == []
    await store.jobs.declare_queue_limits({"mail": QueueLimit(5), "reports": QueueLimit()})
    assert await _queue_limits(store) == {"mail": (1, "config"), "reports": (2, "config")}
    # a config that no longer lists a queue releases it (the code's limit comes back with its worker)
    assert await store.jobs.declare_queue_limits({"mail": QueueLimit(1)}, config=True) == ["reports"]
    assert await _queue_limits(store) == {"mail": (1, "config")}


async def test_a_queue_limit_counts_every_kind_and_frees_a_slot_with_the_outcome_or_the_rescue(
    queue: Queue, store: Store
) -> None:
    await store.jobs.declare_queue_limits({"mail": QueueLimit(3)})
    await queue.enqueue_many([JobSpec(kind, {"i": i}, queue="mail") for i in range(4) for kind in ("a", "b")])
    first = await _claimed(store, "mail", 10, "w")
    assert len(first) == 3 and await _running_in(store, "mail") == 3
    assert await _claimed(store, "mail", 10, "w2") == []  # every kind counts
    assert await store.jobs.complete_succeeded([(first[0], 1)], "w") == {first[0]}  # (a first attempt)
    assert len(await _claimed(store, "mail", 10, "w2")) == 1
    async with store.connection() as connection:  # a dead worker's lease runs out: its rescue frees the slot
        await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' "
                                 "WHERE id = $1", first[1])
    assert await _claimed(store, "mail", 10, "w2") == []
    assert await store.jobs.rescue_expired(5, 3, 100, lease_seconds=30) == [first[1]]
    assert len(await _claimed(store, "mail", 10, "w2")) == 1
    # a queue whose limit is gone is claimed as any other, by the plain claim
    await store.jobs.declare_queue_limits({"mail": QueueLimit()})
    assert await _claimed(store, "mail", 10, "w2") == []
    plain = await store.jobs.claim(["mail"], 10, "w2", 30, kinds=["a", "b"])
    assert len(plain) == 8 - 1 - 3  # all but the done and the running


async def test_a_plain_claim_leaves_limited_queues_alone(queue: Queue, store: Store) -> None:
    """A worker that has not read a queue's limit yet (it reads them every 5 s) claims none
    of its jobs, by any claim but the limited one."""
    await store.jobs.declare_queue_limits({"mail": QueueLimit(1)})
    await store.jobs.declare_limits({"bulk": KindLimit(5, None)})
    await queue.enqueue_many([JobSpec("note", queue="mail"), JobSpec("bulk", queue="mail"), JobSpec("note")])
    assert await store.jobs.claim(["mail"], 10, "w", 30, kinds=["bulk", "note"]) == []
    assert [job.queue for job in await store.jobs.claim(["mail", "default"], 10, "w", 30, kinds=["bulk", "note"])] == ["default"]
    jobs, _ = await store.jobs.claim_limited(["mail", "default"], 10, "w", 30, ["bulk", "note"], scan=100)
    assert [job.queue for job in jobs] == ["mail"]  # the limited claim, within the queue's limit


async def test_a_queue_limit_and_a_kind_limit_both_hold(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": QueueLimit(4)})
    await store.jobs.declare_limits({"bulk": KindLimit(1, None)})
    await queue.enqueue_many([JobSpec("bulk", queue="mail") for _ in range(3)]
                             + [JobSpec("note", queue="mail") for _ in range(6)])
    claimed = await store.jobs.claim_limited(["mail"], 10, "w", 30, ["bulk", "note"], scan=100)
    kinds = sorted(job.kind for job in claimed[0])
    assert kinds == ["bulk", "note", "note", "note"]


async def test_concurrent_claims_of_a_limited_queue_never_overshoot(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": QueueLimit(3)})
    await queue.enqueue_many([JobSpec("k", queue="mail") for _ in range(300)])
    peak = 0

    async def claim(own: Store, worker: str) -> list[Job]:
        jobs, _ = await own.jobs.claim_limited(["mail"], 2, worker, 30, ["k"], scan=100)
        return jobs

    async def sample(own: Store) -> None:
        nonlocal peak
        peak = max(peak, await _running_in(own, "mail"))

    done = await drain_by_claimers(store, 300, claim, sample)
    assert done == 300
    assert peak == 3


async def test_a_claim_leaves_out_a_queue_another_claim_holds_and_never_waits(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": QueueLimit(5), "sms": QueueLimit(5)})
    await queue.enqueue_many([JobSpec("k", queue=name) for name in ("mail", "sms") for _ in range(3)])
    async with store.connection() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock(6383469, hashtext('mail'))")  # (as a claim of mail does)
        jobs, _ = await asyncio.wait_for(store.jobs.claim_limited(["mail", "sms"], 10, "w", 30, ["k"], scan=100), 5)
        assert [job.queue for job in jobs] == ["sms"] * 3
    jobs, _ = await store.jobs.claim_limited(["mail", "sms"], 10, "w", 30, ["k"], scan=100)
    assert [job.queue for job in jobs] == ["mail"] * 3


async def test_a_queue_rate_limit_counts_starts_in_its_window_and_charges_nothing(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"sms": QueueLimit(None, (3, 60.0))})
    await queue.enqueue_many([JobSpec(kind, queue="sms") for kind in ("a", "b", "a", "b", "a")])
    first = await store.jobs.claim_limited(["sms"], 10, "w", 30, ["a", "b"], scan=100)
    assert len(first[0]) == 3
    await store.jobs.complete_succeeded([(job.id, job.attempt) for job in first[0]], "w")
    assert await _claimed(store, "sms", 10, "w") == []  # finished or not, a start counts for its window
    async with store.connection() as connection:
        waiting = await connection.fetch("SELECT attempt, retry_count FROM agora.jobs WHERE status = 'pending'")
        assert [tuple(row) for row in waiting] == [(0, 0), (0, 0)]  # held back, charged nothing
        await connection.execute("UPDATE agora.queue_starts SET started_at = started_at - interval '61 seconds'")
    assert len(await _claimed(store, "sms", 10, "w")) == 2
    async with store.connection() as connection:  # (starts out of their window are deleted by the claims)
        assert await connection.fetchval("SELECT count(*) FROM agora.queue_starts") == 2
        await connection.execute("UPDATE agora.queue_starts SET started_at = started_at - interval '2 minutes'")
    await queue.enqueue_many([JobSpec("a", queue="sms")])
    assert len(await _claimed(store, "sms", 10, "w")) == 1
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.queue_starts") == 1


@pytest.mark.connections(24)
async def test_concurrent_claims_of_a_rate_limited_queue_never_overshoot(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"sms": QueueLimit(None, (7, 60.0))})
    await queue.enqueue_many([JobSpec("k", queue="sms") for _ in range(100)])
    stores = [Store.open(store.database) for _ in range(6)]
    try:
        claims = await asyncio.wait_for(asyncio.gather(*(
            own.jobs.claim_limited(["sms"], 3, f"w{n}", 30, ["k"], scan=100) for n, own in enumerate(stores) for _ in range(3))),
            30)
    finally:
        for own in stores:
            await own.close()
    # (a claim that finds the queue taken by another skips it: the burst may take fewer)
    burst = sum(len(jobs) for jobs, _ in claims)
    assert 1 <= burst <= 7
    rest = [(await store.jobs.claim_limited(["sms"], 3, "w", 30, ["k"], scan=100))[0] for _ in range(4)]
    assert burst + sum(len(jobs) for jobs in rest) == 7


async def test_a_job_held_back_by_a_queue_rate_limit_starts_when_its_window_opens(
    queue: Queue, store: Store, settings: Settings
) -> None:
    started: list[float] = []

    async def tick(job: object, resources: object) -> None:
        started.append(asyncio.get_running_loop().time())

    handlers = Handlers()
    handlers.kind("tick")(tick)
    handlers.queue("ticks", rate=(1, 1.0))
    await queue.enqueue_many([JobSpec("tick", queue="ticks") for _ in range(3)])
    # a poll far away: only the wake at the window's opening can start the next job in time
    async with running(Worker(handlers, settings=settings.replace(poll_seconds=30, queues=("ticks",)))):
        async def three_started() -> bool:
            return len(started) == 3

        await wait_until(three_started, timeout=10)
    async with store.connection() as connection:
        claimed = [row["started_at"] for row in await connection.fetch(
            "SELECT started_at FROM agora.jobs WHERE kind = 'tick' ORDER BY started_at")]
    gaps = [(later - earlier).total_seconds() for earlier, later in itertools.pairwise(claimed)]
    assert all(gap >= 1.0 for gap in gaps), gaps


@pytest.mark.connections(24)
async def test_workers_keep_a_limited_queue_under_its_limit_and_serve_the_others(
    queue: Queue, store: Store, settings: Settings
) -> None:
    """Three workers, each declaring the limit and taking 10 jobs at once, on a limited queue
    beside an unlimited one: the ledger of starts and ends never shows more than 2 of the
    limited queue's jobs at once, and the unlimited queue is not held back by it."""
    spans: dict[str, list[tuple[float, float]]] = {"mail": [], "default": []}

    async def work(job: Any, resources: object) -> None:
        started = asyncio.get_running_loop().time()
        await asyncio.sleep(0.05)
        spans[job.queue].append((started, asyncio.get_running_loop().time()))

    def handlers() -> Handlers:
        table = Handlers()
        table.kind("work")(work)
        table.queue("mail", concurrency=2)
        return table

    await queue.enqueue_many([JobSpec("work", queue="mail") for _ in range(40)]
                             + [JobSpec("work") for _ in range(40)])
    own = settings.replace(queues=("mail", "default"), concurrency=10)
    async with running(Worker(handlers(), settings=own)), running(Worker(handlers(), settings=own)), \
            running(Worker(handlers(), settings=own)):
        async def drained() -> bool:
            return len(spans["mail"]) == 40 and len(spans["default"]) == 40

        await wait_until(drained, timeout=60)
    assert _most_at_once(spans["mail"]) == 2
    assert _most_at_once(spans["default"]) > 2  # the unlimited queue ran side by side
    assert await _queue_limits(store) == {"mail": (2, "code")}


def _most_at_once(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant (an end before a start at the same time)."""
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    most = now = 0
    for _, step in events:
        now += step
        most = max(most, now)
    return most


async def test_a_config_worker_declares_its_queues_and_the_dashboard_and_metrics_show_them(
    queue: Queue, store: Store, settings: Settings
) -> None:
    from agora_pg.config import load_config
    from agora_pg.runner.assembly import build_worker_pool

    await store.jobs.declare_queue_limits({"reports": QueueLimit(9)})  # a worker's: the config's limit replaces it
    pool = build_worker_pool(load_config("""
format = "agora/v1"
[periodic_jobs.digest]
kind = "digest"
[periodic_jobs.digest.schedule]
mode = "every"
hours = 1
[queues.reports]
concurrency = 1
[queues.sms]
rate = [2, 60]
""", {}))
    pool.settings = settings
    task = asyncio.create_task(pool.run(handle_signals=False))
    try:
        async def declared() -> bool:
            return (await _queue_limits(store)).get("reports") == (1, "config")

        await wait_until(declared, timeout=15)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 20)
    await queue.enqueue_many([JobSpec("r", queue="reports") for _ in range(3)])
    assert len(await _claimed(store, "reports", 10, "w")) == 1
    await queue.enqueue_many([JobSpec("s", queue="sms") for _ in range(3)])
    assert len(await _claimed(store, "sms", 10, "w")) == 2
    async with api_client(settings) as client:
        text = (await client.get("/metrics")).text
        overview = (await client.get("/ui/fragments/overview")).text
    for line in ('agora_queue_limit{queue="reports"} 1.0', 'agora_queue_limit_rate{queue="sms"} 2.0',
                 'agora_queue_limit_rate_seconds{queue="sms"} 60.0'):
        assert line in text, text
    assert 'agora_queue_limit{queue="sms"}' not in text  # (no concurrency limit: no sample)
    assert "1 at once, every kind (set in the config)" in overview, overview
    assert "the queue at its limit" in overview, overview
    assert "2 per 60 s, every kind (set in the config)" in overview, overview
    assert "the queue's rate limit (2 started in the window)" in overview, overview
