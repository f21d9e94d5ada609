"""Flow control: concurrency and rate limits per kind and per key, counted by the database at
claim time, and fair share across keys."""

import asyncio
from collections import Counter
from typing import Any

import pytest

from agora_pg import Job, JobSpec, Queue, Worker
from agora_pg.db.job_rows import JobFinish
from agora_pg.db.job_table import last_key_served
from agora_pg.db.store import Store
from agora_pg.limits import KindLimit
from agora_pg.settings import Settings
from agora_pg.worker.handlers import Handlers, KindOptions

from .helpers import drain_by_claimers, running, wait_until
from .test_api import api_client


async def _limits(store: Store) -> dict[str, tuple[int, str | None]]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT kind, concurrency, limit_by FROM agora.kind_limits")
    return {row["kind"]: (row["concurrency"], row["limit_by"]) for row in rows}


async def _running_by_key(store: Store, field: str) -> Counter[str]:
    async with store.connection() as connection:
        rows = await connection.fetch(
            "SELECT payload->>$1 AS key FROM agora.jobs WHERE status = 'processing'", field)
    return Counter(row["key"] for row in rows)


async def _claimed(store: Store, *args: Any, **options: Any) -> list[Job]:
    """What a limited claim took (without the last key it served)."""
    jobs, _ = await store.jobs.claim_limited(*args, **options)
    return jobs


def test_kind_options_check_the_limits() -> None:
    assert KindOptions(concurrency=2, limit_by="customer_id").concurrency == 2
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="concurrency: expected a whole number from 1 to 1,000,000"):
            KindOptions(concurrency=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit_by: expected the name of a payload field"):
        KindOptions(concurrency=2, limit_by=" ")
    with pytest.raises(ValueError, match="needs a concurrency or rate limit"):
        KindOptions(limit_by="customer_id")
    handlers = Handlers()

    @handlers.kind("mail", concurrency=3, limit_by="customer_id")
    async def mail(job: object, resources: object) -> None: ...

    assert handlers.options("mail") == KindOptions(concurrency=3, limit_by="customer_id")


async def test_declared_limits_are_written_changed_and_removed(store: Store) -> None:
    await store.jobs.declare_limits(
        {"mail": KindLimit(3, "customer_id"), "report": KindLimit(1, None), "plain": KindLimit(None, None)})
    assert await _limits(store) == {"mail": (3, "customer_id"), "report": (1, None)}
    await store.jobs.declare_limits({"mail": KindLimit(5, None), "report": KindLimit(None, None)})
    assert await _limits(store) == {"mail": (5, None)}
    assert await store.jobs.limited_kinds(["mail", "report", "other"]) == {"mail": False}
    await store.jobs.declare_limits({"report": KindLimit(None, None, (10, 60.0))})
    assert await store.jobs.limited_kinds(["mail", "report"]) == {"mail": False, "report": True}
    assert await store.jobs.next_rate_room(["report"]) is None  # nothing started yet


async def _declared(store: Store) -> dict[str, tuple[int | None, str]]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT kind, concurrency, declared_in FROM agora.kind_limits")
    return {row["kind"]: (row["concurrency"], row["declared_in"]) for row in rows}


async def test_a_config_declaration_wins_over_the_code_and_releases_what_it_drops(store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(5, None), "report": KindLimit(2, None)})
    assert await store.jobs.declare_limits({"mail": KindLimit(1, None)}, config=True) == []
    assert await _declared(store) == {"mail": (1, "config"), "report": (2, "code")}
    # a worker's declaration, with limits or without, leaves the config's row alone
    await store.jobs.declare_limits({"mail": KindLimit(5, None), "report": KindLimit()})
    await store.jobs.declare_limits({"mail": KindLimit()})
    assert await _declared(store) == {"mail": (1, "config")}
    # a config that no longer lists mail releases it; one without limits for it removes it too
    await store.jobs.declare_limits({"report": KindLimit(3, None)}, config=True)
    assert await store.jobs.declare_limits({}, config=True) == ["report"]
    assert await _declared(store) == {}


async def test_a_running_worker_declares_its_limits_again_when_a_config_releases_them(
    store: Store, settings: Settings
) -> None:
    handlers = Handlers()

    @handlers.kind("mail", concurrency=3)
    async def mail(job: object, resources: object) -> None: ...

    async with running(Worker(handlers, settings=settings)):
        async def declared_by(where: str, concurrency: int) -> bool:
            return (await _declared(store)).get("mail") == (concurrency, where)

        await wait_until(lambda: declared_by("code", 3), timeout=10)
        await store.jobs.declare_limits({"mail": KindLimit(1, None)}, config=True)
        await asyncio.sleep(0.5)
        assert await declared_by("config", 1)  # the worker's refresh does not take it back
        assert await store.jobs.declare_limits({}, config=True) == ["mail"]
        await wait_until(lambda: declared_by("code", 3), timeout=15)  # within LIMITS_REFRESH_SECONDS


async def test_a_config_worker_declares_its_kinds(store: Store, settings: Settings) -> None:
    from agora_pg.config import load_config
    from agora_pg.runner.assembly import build_worker_pool

    pool = build_worker_pool(load_config("""
format = "agora/v1"
[periodic_jobs.digest]
kind = "digest"
[periodic_jobs.digest.schedule]
mode = "every"
hours = 1
[kinds.digest]
concurrency = 1
rate = [10, 60]
""", {}))
    pool.settings = settings
    task = asyncio.create_task(pool.run(handle_signals=False))
    try:
        await wait_until(lambda: _declared_as(store, "digest", (1, "config")), timeout=15)
    finally:
        pool.stop()
        await asyncio.wait_for(task, 20)
    assert await store.jobs.limited_kinds(["digest"]) == {"digest": True}
    async with api_client(settings) as client:
        overview = (await client.get("/ui/fragments/overview")).text
    assert "1 at once, 10 per 60 s (set in the config)" in overview, overview


async def _declared_as(store: Store, kind: str, expected: tuple[int, str]) -> bool:
    return (await _declared(store)).get(kind) == expected


async def test_a_rate_limit_counts_starts_in_its_window_per_key(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(None, "customer", (3, 60.0))})
    await queue.enqueue_many([JobSpec("mail", {"customer": c}) for c in "aaaaab"])
    first = await _claimed(store, ["default"], 100, "w", 30, ["mail"], scan=100)
    assert Counter(job.payload["customer"] for job in first) == {"a": 3, "b": 1}
    await store.jobs.complete_succeeded([(job.id, job.attempt) for job in first], "w")
    assert await _claimed(store, ["default"], 100, "w", 30, ["mail"], scan=100) == []  # no room left
    async with store.connection() as connection:
        waiting = await connection.fetch("SELECT attempt, retry_count FROM agora.jobs WHERE status = 'pending'")
        assert [tuple(row) for row in waiting] == [(0, 0), (0, 0)]  # held back, charged nothing
        await connection.execute("UPDATE agora.kind_starts SET started_at = started_at - interval '61 seconds'")
    again = await _claimed(store, ["default"], 100, "w", 30, ["mail"], scan=100)
    assert Counter(job.payload["customer"] for job in again) == {"a": 2}
    async with store.connection() as connection:  # the starts out of the window are gone
        assert await connection.fetchval("SELECT count(*) FROM agora.kind_starts") == 2


async def test_concurrency_and_rate_limits_both_hold(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"k": KindLimit(1, None, (2, 60.0))})
    await queue.enqueue_many([JobSpec("k") for _ in range(5)])
    [one] = await _claimed(store, ["default"], 10, "w", 30, ["k"], scan=100)
    await store.jobs.complete_succeeded([(one.id, one.attempt)], "w")
    [two] = await _claimed(store, ["default"], 10, "w", 30, ["k"], scan=100)
    await store.jobs.complete_succeeded([(two.id, two.attempt)], "w")
    assert await _claimed(store, ["default"], 10, "w", 30, ["k"], scan=100) == []  # 2 a minute


def test_a_rate_must_be_starts_and_seconds() -> None:
    assert KindOptions(rate=(100, 60)).rate == (100, 60)
    for bad in ((0, 60), (1, 0), (1.5, 60), "100/minute", (1, 2, 3), (True, 60), (1, float("nan")),
                (1, float("inf")), (1, 1e300), (1, 1e12), (2**31, 60)):
        with pytest.raises(ValueError, match=r"rate: expected \(starts, seconds\)"):
            KindOptions(rate=bad)  # type: ignore[arg-type]


async def test_a_plain_claim_leaves_limited_kinds_alone(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"limited": KindLimit(1, None)})
    await queue.enqueue_many([JobSpec("limited"), JobSpec("free"), JobSpec("limited")])
    assert [job.kind for job in await store.jobs.claim(["default"], 10, "w", 30, kinds=["free", "limited"])] == ["free"]
    assert [job.kind for job in await store.jobs.claim(["default", "other"], 10, "w", 30, kinds=["free", "limited"])] == []


async def test_a_kind_limit_counts_running_jobs_and_frees_a_slot_with_the_outcome(
    queue: Queue, store: Store
) -> None:
    await store.jobs.declare_limits({"k": KindLimit(3, None)})
    await queue.enqueue_many([JobSpec("k", {"i": i}) for i in range(10)])
    first = await _claimed(store, ["default"], 10, "w", 30, ["k"], scan=100)
    assert [job.payload["i"] for job in first] == [0, 1, 2]  # in claim order
    assert await _claimed(store, ["default"], 10, "w2", 30, ["k"], scan=100) == []
    assert await store.jobs.complete_succeeded([(first[0].id, first[0].attempt)], "w") == {first[0].id}
    await store.jobs.finish([JobFinish(first[1].id, first[1].attempt, "failed", "E", "boom", None, 0.0, False)],
                            "w", 3, 3)
    again = await _claimed(store, ["default"], 10, "w2", 30, ["k"], scan=100)
    # two slots free, taken in claim order (the failed job is due again now: behind 3 and 4)
    assert [job.payload["i"] for job in again] == [3, 4]
    assert await _claimed(store, ["default"], 10, "w2", 30, ["k"], scan=100) == []


async def test_a_key_limit_counts_each_key_apart(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(2, "customer")})
    specs = [JobSpec("mail", {"customer": c, "i": i}) for i in range(5) for c in ("a", "b", "c")]
    specs.append(JobSpec("mail", {"i": 99}))  # no key: one shared key of its own
    await queue.enqueue_many(specs)
    claimed = await _claimed(store, ["default"], 100, "w", 30, ["mail"], scan=1000)
    assert Counter(job.payload.get("customer") for job in claimed) == {"a": 2, "b": 2, "c": 2, None: 1}
    assert await _claimed(store, ["default"], 100, "w", 30, ["mail"], scan=1000) == []


async def test_a_rescue_frees_the_slot(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"k": KindLimit(1, None)})
    await queue.enqueue_many([JobSpec("k"), JobSpec("k")])
    [held] = await _claimed(store, ["default"], 5, "dead-worker", 30, ["k"], scan=100)
    async with store.connection() as connection:
        await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = $1",
                                 held.id)
    assert await _claimed(store, ["default"], 5, "w", 30, ["k"], scan=100) == []
    assert await store.jobs.rescue_expired(5, 3, 100, lease_seconds=30) == [held.id]
    [next_job] = await _claimed(store, ["default"], 5, "w", 30, ["k"], scan=100)
    assert next_job.status.value == "processing"


async def test_concurrent_limited_claims_never_overshoot(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(2, "customer")})
    await queue.enqueue_many([JobSpec("mail", {"customer": f"c{i % 10}"}) for i in range(400)])
    peak: Counter[str] = Counter()

    async def sample(own: Store) -> None:
        for key, n in (await _running_by_key(own, "customer")).items():
            peak[key] = max(peak[key], n)

    done = await drain_by_claimers(
        store, 400, lambda own, worker: _claimed(own, ["default"], 7, worker, 30, ["mail"], scan=1000), sample)
    assert done == 400
    assert set(peak) == {f"c{i}" for i in range(10)} and max(peak.values()) == 2


async def test_metrics_and_the_dashboard_show_each_limit_and_why_jobs_wait(
    queue: Queue, store: Store, settings: Settings
) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(2, "customer"), "report": KindLimit(1, None),
                                     "send": KindLimit(fair_by="tenant")})
    await queue.enqueue_many([JobSpec("mail", {"customer": c}) for c in ("a", "a", "a", "b")])
    await queue.enqueue_many([JobSpec("send", {"tenant": t}) for t in ("x", "x", "y")])
    claimed = await _claimed(store, ["default"], 10, "w", 30, ["mail"], scan=100)
    assert len(claimed) == 3  # a, a, b: the third of a waits
    snapshot = await store.metrics()
    by_kind = {limit.kind: limit for limit in snapshot.kind_limits}
    assert (by_kind["mail"].concurrency, by_kind["mail"].limit_by) == (2, "customer")
    assert (by_kind["mail"].running, by_kind["mail"].full_keys, by_kind["mail"].waiting) == (3, 1, 1)
    assert (by_kind["report"].running, by_kind["report"].full_keys, by_kind["report"].waiting) == (0, 0, 0)
    async with api_client(settings) as client:
        text = (await client.get("/metrics")).text
        overview = (await client.get("/ui/fragments/overview")).text
    for line in ('agora_kind_limit{kind="mail"} 2.0', 'agora_kind_limit_running{kind="mail"} 3.0',
                 'agora_kind_limit_full_keys{kind="mail"} 1.0', 'agora_kind_limit_waiting{kind="mail"} 1.0',
                 'agora_kind_limit{kind="report"} 1.0', 'agora_kind_limit_waiting{kind="send"} 3.0',
                 'agora_kind_limit_waiting_keys{kind="send"} 2.0', 'agora_kind_limit_waiting_keys{kind="mail"} 1.0'):
        assert line in text, text
    assert 'agora_kind_limit{kind="send"}' not in text  # (no concurrency limit: no sample)
    assert "Flow control" in overview
    assert "2 at once per customer; shared by customer" in overview and "1 customer value(s) at a limit" in overview
    assert "shared by tenant" in overview and "3 of 2 tenant value(s), taking turns" in overview


async def test_a_job_held_back_by_a_rate_limit_starts_when_its_window_opens(
    queue: Queue, store: Store, settings: Settings
) -> None:
    handlers = Handlers()
    started: list[float] = []

    @handlers.kind("tick", rate=(1, 1.0))
    async def tick(job: object, resources: object) -> None:
        started.append(asyncio.get_running_loop().time())

    await queue.enqueue_many([JobSpec("tick") for _ in range(3)])
    # a poll far away: only the wake at the window's opening can start the next job in time
    async with running(Worker(handlers, settings=settings.replace(poll_seconds=30))):
        async def three_started() -> bool:
            return len(started) == 3

        await wait_until(three_started, timeout=10)
    # judged by the claims' own clock (the handler may start a while after its claim on a busy host)
    async with store.connection() as connection:
        claimed = [row["started_at"] for row in await connection.fetch(
            "SELECT started_at FROM agora.jobs WHERE kind = 'tick' ORDER BY started_at")]
    gaps = [(later - earlier).total_seconds() for earlier, later in zip(claimed, claimed[1:], strict=False)]
    # at least the window apart; well before the 30 s poll (only the wake can start them)
    assert all(0.99 <= gap < 5.0 for gap in gaps), gaps


# -- fair share ----------------------------------------------------------------


def test_fair_by_must_name_a_field_and_needs_no_limit() -> None:
    assert KindOptions(fair_by="tenant").fair_by == "tenant"
    for bad in (" ", "", 3):
        with pytest.raises(ValueError, match="fair_by: expected the name of a payload field"):
            KindOptions(fair_by=bad)  # type: ignore[arg-type]


def test_the_last_key_served_is_the_last_visited_from_the_cursor_round() -> None:
    assert last_key_served({"a", "c"}, None) == "c"
    assert last_key_served({"d", "e"}, "c") == "e"
    assert last_key_served({"d", "a", "b"}, "c") == "b"  # d, then round to a, b
    assert last_key_served({"c"}, "c") == "c"


async def _fair_keys(store: Store) -> dict[int, str | None]:
    async with store.connection() as connection:
        rows = await connection.fetch("SELECT id, fair_key FROM agora.jobs")
    return {row["id"]: row["fair_key"] for row in rows}


async def test_a_job_gets_its_key_at_insert_or_when_its_kind_is_declared(queue: Queue, store: Store) -> None:
    early = await queue.enqueue("mail", {"tenant": "t1"})
    assert (await _fair_keys(store))[early.id] is None  # no worker declared the kind yet
    await store.jobs.declare_limits({"mail": KindLimit(fair_by="tenant"), "report": KindLimit(2, "site")})
    one = await queue.enqueue("mail", {"tenant": "t2"})
    batch = await queue.enqueue_many([JobSpec("mail", {"tenant": "t3"}), JobSpec("report", {"site": "s1"}),
                                      JobSpec("mail", {}), JobSpec("plain", {"tenant": "t4"})])
    keys = await _fair_keys(store)
    assert keys[early.id] == "t1" and keys[one.id] == "t2"  # the declaration keyed the waiting job
    assert [keys[job.id] for job in batch] == ["t3", "s1", None, None]  # limit_by keys too; no field, no key
    assert await _limits(store) == {"mail": (None, None), "report": (2, "site")}


async def test_a_claim_takes_one_job_per_key_in_turn(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(fair_by="tenant")})
    await queue.enqueue_many([JobSpec("mail", {"tenant": "big"}) for _ in range(500)])
    await queue.enqueue_many([JobSpec("mail", {"tenant": f"small{n}"}) for n in range(6) for _ in range(2)])
    cursor = None
    served: list[list[str]] = []
    for _ in range(4):
        jobs, cursor = await store.jobs.claim_limited(["default"], 4, "w", 30, ["mail"], scan=100, after_key=cursor)
        served.append(sorted(job.payload["tenant"] for job in jobs))
    # seven keys, four at a time, from the key after the last one served: the big tenant
    # gets one turn in seven; once the small ones have no job left, the slots are its
    assert served == [["big", "small0", "small1", "small2"], ["big", "small3", "small4", "small5"],
                      ["small0", "small1", "small2", "small3"], ["big", "big", "small4", "small5"]]


async def test_fewer_keys_than_slots_take_several_jobs_of_each(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(fair_by="tenant")})
    await queue.enqueue_many([JobSpec("mail", {"tenant": tenant}) for tenant in ("a", "b") for _ in range(10)])
    jobs, cursor = await store.jobs.claim_limited(["default"], 7, "w", 30, ["mail"], scan=100)
    assert Counter(job.payload["tenant"] for job in jobs) == {"a": 4, "b": 3} or \
        Counter(job.payload["tenant"] for job in jobs) == {"a": 3, "b": 4}
    assert cursor in ("a", "b")


async def test_a_per_key_limit_does_not_block_at_the_head_of_the_queue(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(2, "customer")})
    await queue.enqueue_many([JobSpec("mail", {"customer": "busy"}) for _ in range(1000)])
    await queue.enqueue("mail", {"customer": "quiet"})
    jobs = await _claimed(store, ["default"], 10, "w", 30, ["mail"], scan=100)
    # the first 100 jobs are all of "busy", which is full at 2: "quiet" is found by its key
    assert Counter(job.payload["customer"] for job in jobs) == {"busy": 2, "quiet": 1}


async def test_far_from_its_limit_a_per_key_kind_is_claimed_in_claim_order(queue: Queue, store: Store) -> None:
    await queue.enqueue_many([JobSpec("mail", {"customer": customer}) for customer in ("a", "b") for _ in range(10)])
    await store.jobs.declare_limits({"mail": KindLimit(10, "customer")})
    jobs = await _claimed(store, ["default"], 10, "w", 30, ["mail"], scan=100)
    # 0 running + 10 asked for: no key can pass 10, so no key is counted or visited
    assert Counter(job.payload["customer"] for job in jobs) == {"a": 10}
    await store.jobs.declare_limits({"mail": KindLimit(12, "customer")})
    jobs = await _claimed(store, ["default"], 5, "w", 30, ["mail"], scan=100)
    # 10 running + 5 asked for could pass 12 for "a": the keys are visited in turn
    assert Counter(job.payload["customer"] for job in jobs) == {"b": 5}


async def test_the_limited_claim_is_never_jit_compiled(queue: Queue, store: Store) -> None:
    # (its generic plans' estimates grow with the table: compiled, a 3 ms claim took 30 to 450 ms)
    await store.jobs.declare_limits({"mail": KindLimit(5)})
    await queue.enqueue("mail")
    async with store.connection() as connection:
        settings = await connection.fetch(
            "SELECT p.proname, p.proconfig FROM pg_proc AS p JOIN pg_namespace AS n ON n.oid = p.pronamespace "
            "WHERE n.nspname = 'agora' AND p.proname IN ('claim_limited_jobs', 'limit_room', 'queue_room')")
    assert {row["proname"]: "jit=off" in row["proconfig"] for row in settings} == dict.fromkeys(
        ("claim_limited_jobs", "limit_room", "queue_room"), True)
    assert len(await _claimed(store, ["default"], 10, "w", 30, ["mail"], scan=100)) == 1


async def test_a_claim_leaves_out_a_kind_another_claim_holds_and_never_waits(queue: Queue, store: Store) -> None:
    await store.jobs.declare_limits({"mail": KindLimit(5), "sms": KindLimit(5)})
    await queue.enqueue_many([JobSpec(kind, {}) for kind in ("mail", "sms") for _ in range(3)])
    async with store.connection() as holder, holder.transaction():
        await holder.execute("SELECT pg_advisory_xact_lock(6383468, hashtext('mail'))")  # (as a claim of mail does)
        jobs = await asyncio.wait_for(_claimed(store, ["default"], 10, "w", 30, ["mail", "sms"], scan=100), 5)
        assert [job.kind for job in jobs] == ["sms"] * 3
    jobs = await _claimed(store, ["default"], 10, "w", 30, ["mail", "sms"], scan=100)
    assert [job.kind for job in jobs] == ["mail"] * 3


async def test_small_tenants_finish_soon_beside_one_with_100000_jobs(
    queue: Queue, store: Store, settings: Settings
) -> None:
    handlers = Handlers()

    @handlers.kind("send", fair_by="tenant")
    async def send(job: object, resources: object) -> None:
        await asyncio.sleep(0.01)

    await queue.enqueue_many([JobSpec("send", {"tenant": "huge"}) for _ in range(100_000)])
    async with running(Worker(handlers, settings=settings.replace(concurrency=10))):
        async def huge_running() -> bool:
            async with store.connection() as connection:
                return bool(await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE status = 'done'"))

        await wait_until(huge_running, timeout=30)
        small = await queue.enqueue_many(
            [JobSpec("send", {"tenant": f"small{n}"}) for n in range(10) for _ in range(10)])

        async def small_done() -> bool:
            async with store.connection() as connection:
                return bool(await connection.fetchval(
                    "SELECT count(*) = 100 FROM agora.jobs WHERE id = ANY($1::bigint[]) AND status = 'done'",
                    [job.id for job in small]))

        await wait_until(small_done, timeout=30)
    async with store.connection() as connection:
        # the huge tenant's jobs that finished while the small ones waited or ran: with a
        # turn per tenant, about one per round of the eleven tenants (ten rounds), and the
        # ten that were running; in order of arrival, all 100,000 but those done before
        overtaking = await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE payload->>'tenant' = 'huge' AND status = 'done' "
            "AND finished_at > (SELECT min(created_at) FROM agora.jobs WHERE id = ANY($1::bigint[])) "
            "AND finished_at < (SELECT max(finished_at) FROM agora.jobs WHERE id = ANY($1::bigint[]))",
            [job.id for job in small])
        huge_done = await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE payload->>'tenant' = 'huge' "
                                              "AND status = 'done'")
    assert overtaking <= 60, f"{overtaking} jobs of the huge tenant ran while the small ones waited"
    assert huge_done < 90_000  # (the huge tenant was still being served)


async def test_keys_are_visited_in_the_order_the_worker_keeps_its_place_in(queue: Queue, store: Store) -> None:
    """Upper and lower case, accents: the database visits keys in code-point order (the
    column's "C" collation), the order in which the worker computes its place."""
    await store.jobs.declare_limits({"mail": KindLimit(fair_by="tenant")})
    tenants = ["B", "a", "é", "Z", "b"]
    await queue.enqueue_many([JobSpec("mail", {"tenant": tenant}) for tenant in tenants for _ in range(2)])
    cursor, served = None, []
    for _ in range(5):
        jobs, cursor = await store.jobs.claim_limited(["default"], 1, "w", 30, ["mail"], scan=100, after_key=cursor)
        served += [job.payload["tenant"] for job in jobs]
    assert served == sorted(tenants)  # one each, in code-point order: B Z a b é
