"""The processes that run scheduled pipelines share out who claims each tick first,
against a real database: who counts as a peer, and what happens to the ticks of a peer
that does not claim them (gone, or not registering the pipeline)."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime

from agora_pg.db.schedule_rows import ScheduleRegistration
from agora_pg.db.store import Store
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool
from agora_pg.runner.run_batches import RunBatches
from agora_pg.runner.tick_shares import FALLBACK_DELAY, TickShares
from agora_pg.settings import Settings

from .helpers import wait_until


async def _execute(store: Store, sql: str, *args: object) -> None:
    async with store.connection() as connection:
        await connection.execute(sql, *args)


async def test_peers_are_the_live_workers_that_run_pipelines(store: Store) -> None:
    await store.workers.register("jobs-only", "host", 1, ["default"])
    await store.workers.register("new", "host", 2, (), runs_pipelines=True)  # no lease yet: counted from its start
    await store.workers.register("both", "host", 3, ["mail"])
    await store.workers.register("both", "host", 3, (), runs_pipelines=True)  # its pipelines, after its job worker
    await store.workers.register("pipelines-then-jobs", "host", 4, (), runs_pipelines=True)
    await store.workers.register("pipelines-then-jobs", "host", 4, ["default"])
    await store.workers.register("stopped", "host", 5, (), runs_pipelines=True)
    await store.workers.stop("stopped")
    await store.workers.register("lapsed", "host", 6, (), runs_pipelines=True)
    await store.workers.register("old", "host", 7, (), runs_pipelines=True)
    await _execute(store, "UPDATE agora.workers SET lease_expires_at = now() - interval '1 second' WHERE id = 'lapsed'")
    await _execute(store, "UPDATE agora.workers SET started_at = now() - interval '1 hour' WHERE id = 'old'")
    for worker_id in ("jobs-only", "both"):
        await store.workers.renew_leases(worker_id, 30, [], [])
    peers, database_now, _ = await store.workers.live_pipeline_workers(30)
    assert peers == ["both", "new", "pipelines-then-jobs"]
    assert abs((database_now - datetime.now(UTC)).total_seconds()) < 5
    async with store.connection() as connection:
        rows = {row["id"]: (list(row["queues"]), row["runs_pipelines"])
                for row in await connection.fetch("SELECT id, queues, runs_pipelines FROM agora.workers")}
    assert rows["both"] == (["mail"], True)  # the job worker's queues stay
    assert rows["pipelines-then-jobs"] == (["default"], True)
    assert rows["jobs-only"] == (["default"], False)


async def test_a_tick_another_peer_claims_first_runs_after_the_fallback_delay(store: Store) -> None:
    # "ghost" is a live peer that never claims (killed before its lease passed, or not
    # registering these pipelines): this process claims its share FALLBACK_DELAY after the
    # due moment, and its own share at once; every tick is claimed exactly once.
    spec = Schedule.every(seconds=60).spec
    ids = [f"p{i:03}" for i in range(60)]
    for pipeline_id in ids:
        await store.schedules.upsert(ScheduleRegistration(pipeline_id, "every", spec, None, 60, 10))
    batches = RunBatches(store, "me", 30)
    batches.shares.update(["ghost"])
    mine = {pipeline_id for pipeline_id in ids if batches.shares.claims_first(pipeline_id)}
    assert 0 < len(mine) < len(ids)
    due = time.monotonic() + 0.05
    claimed_at: dict[str, float] = {}

    async def claim(pipeline_id: str) -> None:
        run = await batches.claim(pipeline_id, spec, not_before=due)
        assert run is not None and run.schedule.pipeline_id == pipeline_id
        claimed_at[pipeline_id] = time.monotonic() - due

    await asyncio.gather(*(claim(pipeline_id) for pipeline_id in ids))
    assert max(claimed_at[pipeline_id] for pipeline_id in mine) < FALLBACK_DELAY
    assert min(claimed_at[pipeline_id] for pipeline_id in set(ids) - mine) >= FALLBACK_DELAY
    async with store.connection() as connection:
        runs = await connection.fetchval("SELECT count(*) FROM agora.runs WHERE worker_id = 'me'")
    assert runs == len(ids)


async def test_a_pool_registers_as_a_peer_shares_with_a_live_one_and_gives_up_its_lease_at_stop(
    store: Store, settings: Settings
) -> None:
    # A pool alongside a live peer that never claims: the peer's share of 30 every-second
    # pipelines still runs (each tick once, after the fallback delay), the pool's own share
    # on time; the pool's process is a peer while it runs and, stopped cleanly, no longer.
    await store.workers.register("ghost", "host", 1, (), runs_pipelines=True)
    await store.workers.renew_leases("ghost", 3600, [], [])
    ids = [f"s{n:02}" for n in range(30)]
    pool = WorkerPool(settings=settings)
    for pipeline_id in ids:
        pool.register(ScheduledPipeline(factory=Nothing, schedule=Schedule.every(seconds=1), pipeline_id=pipeline_id))
    serving = asyncio.create_task(pool.run(handle_signals=False))
    try:
        await wait_until(lambda: _each_ran(store, len(ids), times=3), timeout=30)
        peers, _, _ = await store.workers.live_pipeline_workers(30)
    finally:
        pool.stop()
        await asyncio.wait_for(serving, 30)
    assert len(peers) == 2 and "ghost" in peers
    [me] = [peer for peer in peers if peer != "ghost"]
    mine = {pipeline_id for pipeline_id in ids if TickShares(me, ["ghost"]).claims_first(pipeline_id)}
    assert 0 < len(mine) < len(ids)
    async with store.connection() as connection:
        runs = await connection.fetch(  # (each pipeline's first run is at its registration, before the shares)
            """SELECT pipeline_id, extract(epoch FROM started_at - scheduled_for)::float8 AS lag FROM (
                   SELECT *, row_number() OVER (PARTITION BY pipeline_id ORDER BY scheduled_for) AS n FROM agora.runs
               ) AS numbered WHERE n > 1""")
        duplicates = await connection.fetchval(
            "SELECT count(*) FROM (SELECT 1 FROM agora.runs GROUP BY pipeline_id, scheduled_for HAVING count(*) > 1) AS d")
    assert duplicates == 0
    ghosts = [row["lag"] for row in runs if row["pipeline_id"] not in mine]
    assert ghosts and min(ghosts) >= FALLBACK_DELAY - 0.01  # the ghost's share: asked for after the fallback delay
    assert (await store.workers.live_pipeline_workers(30))[0] == ["ghost"]  # the stopped pool is no peer any more


class Nothing:
    """A pipeline (and its factory) that does nothing."""

    def __init__(self) -> None:
        pass

    async def run(self) -> None:
        return None


async def _each_ran(store: Store, pipelines: int, times: int) -> bool:
    async with store.connection() as connection:
        counts = [row["count"] for row in await connection.fetch(
            "SELECT pipeline_id, count(*) FROM agora.runs WHERE status = 'succeeded' GROUP BY 1")]
    return len(counts) == pipelines and min(counts) >= times
