"""Concurrency limits per queue: at most N running jobs of a queue (of every kind) across
every worker, counted by the database at claim time under a lock of the queue's limit row."""

import asyncio
from typing import Any

import pytest

from agora_pg import JobSpec, Queue, Worker
from agora_pg.db.job_rows import KindLimit
from agora_pg.db.store import Store
from agora_pg.settings import Settings
from agora_pg.worker.handlers import Handlers

from .helpers import running, wait_until
from .test_api import api_client


async def _queue_limits(store: Store) -> dict[str, tuple[int, str]]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT queue, concurrency, declared_in FROM agora.queue_limits")
    return {row["queue"]: (row["concurrency"], row["declared_in"]) for row in rows}


async def _running_in(store: Store, queue: str) -> int:
    async with store.connection() as connection:
        return int(await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE status = 'processing' AND queue = $1", queue))


async def _claimed(store: Store, queue: str, limit: int, worker: str, **options: Any) -> list[int]:
    jobs, _ = await store.jobs.claim_from_limited_queue(queue, limit, worker, 30, **options)
    return [job.id for job in jobs]


def test_handlers_queue_checks_its_limit() -> None:
    handlers = Handlers()
    handlers.queue("mail", concurrency=3)
    handlers.queue("old", concurrency=None)
    assert handlers.queue_limits() == {"mail": 3, "old": None}
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="concurrency of queue 'mail' must be a whole number >= 1"):
            handlers.queue("mail", concurrency=bad)  # type: ignore[arg-type]
    for name in ("", " ", "mail\x1b[2J"):
        with pytest.raises(ValueError, match="a queue must be a non-empty string of printable characters"):
            handlers.queue(name, concurrency=1)


async def test_declared_queue_limits_are_written_changed_removed_and_the_config_wins(store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": 3, "reports": 1, "plain": None})
    assert await _queue_limits(store) == {"mail": (3, "code"), "reports": (1, "code")}
    assert await store.jobs.limited_queues(["mail", "default"]) == {"mail": 3}
    await store.jobs.declare_queue_limits({"mail": 5, "reports": None})
    assert await _queue_limits(store) == {"mail": (5, "code")}
    # a config's declaration wins; a worker's, with a limit or without, leaves it alone
    assert await store.jobs.declare_queue_limits({"mail": 1, "reports": 2}, config=True) == []
    await store.jobs.declare_queue_limits({"mail": 5, "reports": None})
    assert await _queue_limits(store) == {"mail": (1, "config"), "reports": (2, "config")}
    # a config that no longer lists a queue releases it (the code's limit comes back with its worker)
    assert await store.jobs.declare_queue_limits({"mail": 1}, config=True) == ["reports"]
    assert await _queue_limits(store) == {"mail": (1, "config")}


async def test_a_queue_limit_counts_every_kind_and_frees_a_slot_with_the_outcome_or_the_rescue(
    queue: Queue, store: Store
) -> None:
    await store.jobs.declare_queue_limits({"mail": 3})
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
    # a queue whose limit is gone is claimed as any other
    await store.jobs.declare_queue_limits({"mail": None})
    assert len(await _claimed(store, "mail", 10, "w2")) == 8 - 1 - 3  # all but the done and the running


async def test_a_queue_limit_and_a_kind_limit_both_hold(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": 4})
    await store.jobs.declare_limits({"bulk": KindLimit(1, None)})
    await queue.enqueue_many([JobSpec("bulk", queue="mail") for _ in range(3)]
                             + [JobSpec("note", queue="mail") for _ in range(6)])
    claimed = await store.jobs.claim_from_limited_queue("mail", 10, "w", 30, limited_kinds=["bulk"])
    kinds = sorted(job.kind for job in claimed[0])
    assert kinds == ["bulk", "note", "note", "note"]


async def test_concurrent_claims_of_a_limited_queue_never_overshoot(queue: Queue, store: Store) -> None:
    await store.jobs.declare_queue_limits({"mail": 3})
    await queue.enqueue_many([JobSpec("k", queue="mail") for _ in range(300)])
    stores = [Store.open(store.database) for _ in range(6)]
    peak = 0
    done = 0
    try:
        async def work(own: Store, worker: str) -> None:
            nonlocal done, peak
            for _ in range(400):
                jobs, _ = await own.jobs.claim_from_limited_queue("mail", 2, worker, 30)
                peak = max(peak, await _running_in(own, "mail"))
                if jobs:
                    await asyncio.sleep(0.001)
                    await own.jobs.complete_succeeded([(job.id, job.attempt) for job in jobs], worker)
                    done += len(jobs)
                elif done >= 300:
                    return

        await asyncio.wait_for(asyncio.gather(*(work(own, f"w{n}") for n, own in enumerate(stores))), 60)
    finally:
        for own in stores:
            await own.close()
    assert done == 300
    assert peak == 3


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

    await store.jobs.declare_queue_limits({"reports": 9})  # a worker's: the config's limit replaces it
    pool = build_worker_pool(load_config("""
format = "agora/v1"
[periodic_jobs.digest]
kind = "digest"
[periodic_jobs.digest.schedule]
mode = "every"
hours = 1
[queues.reports]
concurrency = 1
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
    async with api_client(settings) as client:
        text = (await client.get("/metrics")).text
        overview = (await client.get("/ui/fragments/overview")).text
    assert 'agora_queue_limit{queue="reports"} 1.0' in text, text
    assert "1 at once, every kind (set in the config)" in overview, overview
    assert "the queue at its limit" in overview, overview
