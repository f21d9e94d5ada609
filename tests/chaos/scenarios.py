"""The chaos scenarios. Each takes a ``Setup`` (a migrated database of its own, a work
directory, a way to register processes for clean-up) and a ``Size``, inflicts its fault
on real worker processes and a real PostgreSQL, and returns a ``Result`` whose
``violations()`` are the pass thresholds."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import httpx

from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.job_spec import JobSpec
from agora_pg.limits import QueueLimit
from tests.faults import PgBouncer, PgProxy, PrivateServer, free_port

from .harness import (
    LEASE_SECONDS,
    REPO,
    WORKER_MODULE,
    Fleet,
    Result,
    Size,
    Tally,
    chaos_env,
    measure_flow,
    peak_running,
    rate,
    read_ends,
    read_ledger,
    rerun_delays,
    tally,
    wait_drained,
    wait_workers,
    waiting_jobs,
    wake_up_latency,
)



class ScenarioSkipped(Exception):
    """What the scenario needs is not on this machine (the reason)."""


@dataclasses.dataclass
class Setup:
    """What a scenario runs on: ``database_url`` (migrated, its own), ``workdir`` (empty,
    its own), ``track`` (registers a process to kill at clean-up)."""

    database_url: str
    workdir: Path
    track: Callable[[subprocess.Popen[bytes]], None]
    seed: int = 7

    def fleet(self, database_url: str | None = None, module: str = WORKER_MODULE, **env: str) -> tuple[Fleet, Path]:
        ledger = self.workdir / "ledger"
        ledger.mkdir(exist_ok=True)
        logs = self.workdir / "logs"
        logs.mkdir(exist_ok=True)
        return Fleet(chaos_env(database_url or self.database_url, ledger, **env), logs, self.track, module), ledger


async def crash_recovery(setup: Setup, size: Size) -> Result:
    """3 workers draining a steady flow; one is killed with SIGKILL and replaced a second later."""
    fleet, ledger = setup.fleet()
    fleet.start(3)
    await wait_workers(setup.database_url, 3)
    rng = random.Random(setup.seed)

    async def fault() -> dict[str, Any]:
        fleet.kill_random(rng)
        await asyncio.sleep(1.0)
        fleet.start(1)
        return {}

    slow = dataclasses.replace(size, job_seconds=0.1)  # jobs long enough for a kill to cut some short
    result = await measure_flow("crash_recovery", slow, setup.database_url, fleet, ledger, fault)
    _note_reruns(result, ledger, fleet)
    return result


async def repeated_kills(setup: Setup, size: Size) -> Result:
    """4 workers draining; every 2 s one of them, at random, is killed and a new one started."""
    fleet, ledger = setup.fleet()
    fleet.start(4)
    await wait_workers(setup.database_url, 4)
    rng = random.Random(setup.seed)

    async def fault() -> dict[str, Any]:
        kills = 0
        deadline = time.monotonic() + size.fault
        while time.monotonic() < deadline:
            fleet.kill_random(rng)
            fleet.start(1)
            kills += 1
            await asyncio.sleep(2.0)
        return {"kills": kills}

    slow = dataclasses.replace(size, job_seconds=0.1)
    result = await measure_flow("repeated_kills", slow, setup.database_url, fleet, ledger, fault)
    _note_reruns(result, ledger, fleet)
    return result


LIMIT_KEYS = 50
LIMIT_PER_KEY = 2  # chaos_app's "limited" kind: concurrency=2, limit_by="key"
LIMIT_PER_QUEUE = 90  # and its queue "limited": concurrency=90 (of 50 x 2 the keys would allow)


async def limits_under_kills(setup: Setup, size: Size) -> Result:
    """4 workers drain jobs of a kind limited to 2 running per key, over 50 keys, in a
    queue limited to 90 running jobs; every 2 s one worker, at random, is killed with
    SIGKILL and a new one started. From the ledger's start and end times (a killed
    execution ends at its kill), no key may ever have had more than 2 executions running
    at once, nor the queue more than 90."""
    # 4 x 50 slots for 90 running jobs at most: the limits, not the slots, hold jobs back
    fleet, ledger = setup.fleet(WORKER_CONCURRENCY="50", WORKER_QUEUES="default,limited")
    fleet.start(4)
    await wait_workers(setup.database_url, 4)
    rng = random.Random(setup.seed)
    jobs = int(size.rate * (size.baseline + size.fault)) * 2  # 100 at a time for 0.5 s: the storm's length
    store = Store.open(Database(setup.database_url), pool_size=1)
    try:
        enqueued = await store.jobs.enqueue(
            [JobSpec("limited", {"key": f"k{i % LIMIT_KEYS}", "seconds": 0.5}, queue="limited")
             for i in range(jobs)])
    finally:
        await store.close()
    acknowledged = [job.id for job, _ in enqueued]
    kills = 0
    deadline = time.monotonic() + size.fault
    while time.monotonic() < deadline:
        await asyncio.sleep(2.0)
        fleet.kill_random(rng)
        fleet.start(1)
        kills += 1
    drained = await wait_drained(setup.database_url, 180.0)
    codes = fleet.stop()
    executions = read_ledger(ledger)
    counts = await tally(setup.database_url, executions, fleet.killed, acknowledged, kind="limited")
    connection = await asyncpg.connect(setup.database_url)
    try:
        key_of = {row["id"]: row["key"] for row in await connection.fetch(
            "SELECT id, payload->>'key' AS key FROM agora.jobs WHERE kind = 'limited'")}
    finally:
        await connection.close()
    ends = read_ends(ledger)
    peaks = peak_running(executions, ends, fleet.killed, key_of)
    queue_peak = max(peak_running(executions, ends, fleet.killed, dict.fromkeys(key_of, "limited")).values(),
                     default=0)
    over = {key: peak for key, peak in peaks.items() if peak > LIMIT_PER_KEY}
    result = Result("limits_under_kills", size.name, counts, shape=False,
                    notes={"kills": kills, "drained": drained, "stop_codes": codes,
                           "peak_running_per_key": max(peaks.values(), default=0),
                           "peak_running_in_queue": queue_peak})
    if over:
        result.extra_violations.append(f"keys over their limit of {LIMIT_PER_KEY}: {over}")
    if queue_peak > LIMIT_PER_QUEUE:
        result.extra_violations.append(f"the queue over its limit of {LIMIT_PER_QUEUE}: {queue_peak} at once")
    if len(peaks) < LIMIT_KEYS or max(peaks.values()) < LIMIT_PER_KEY or queue_peak < LIMIT_PER_QUEUE:
        result.extra_violations.append(f"a limit was never reached ({len(peaks)} keys ran, at most {queue_peak} "
                                       "in the queue): the test proves nothing")
    return result


async def cancels_under_kills(setup: Setup, size: Size) -> Result:
    """4 workers drain jobs of 1 s; during a storm that kills a random worker
    with SIGKILL every 1.5 s (and starts another), running jobs are cancelled through the
    API. Every acknowledged cancel must end ``cancelled`` (or ``done`` by the attempt it
    found, whose handler returned before the cancel reached it) with no attempt started
    after it, and the drain after the storm must run at least half as fast as before it."""
    full = size.name == "full"
    jobs, kills, cancels = (2000, 16, 100) if full else (600, 4, 20)
    fleet, ledger = setup.fleet()
    api, base = await _start_api(setup, dict(fleet.env))
    fleet.start(4)
    await wait_workers(setup.database_url, 4)
    rng = random.Random(setup.seed)
    store = Store.open(Database(setup.database_url), pool_size=1)
    try:
        enqueued = await store.jobs.enqueue([JobSpec("work", {"seconds": 1.0}) for _ in range(jobs)])
    finally:
        await store.close()
    acknowledged = [job.id for job, _ in enqueued]
    # (a baseline short enough that a backlog is left after the storm: its drain is measured)
    baseline = min(size.baseline, 10.0)
    storm_start = time.time() + baseline
    await asyncio.sleep(baseline)
    acked: dict[int, int] = {}  # job id -> its attempt when the cancel was acknowledged
    connection = await asyncpg.connect(setup.database_url)
    try:
        async with httpx.AsyncClient(timeout=10) as client:
            for kill in range(kills):
                fleet.kill_random(rng)
                fleet.start(1)
                running = [row["id"] for row in await connection.fetch(
                    "SELECT id FROM agora.jobs WHERE status = 'processing' AND kind = 'work' ORDER BY random() "
                    "LIMIT $1", -(-cancels // kills))]
                for job_id in running[: cancels - len(acked)]:
                    response = await client.post(f"{base}/jobs/{job_id}/cancel")
                    if response.status_code == 200:
                        acked[job_id] = int(response.json()["attempt"])
                await asyncio.sleep(max(0.0, storm_start + 1.5 * (kill + 1) - time.time()))
    finally:
        await connection.close()
    storm_end = time.time()
    drained = await wait_drained(setup.database_url, 240.0)
    drained_at = time.time()
    codes = fleet.stop()
    api.terminate()
    api.wait(10)
    executions = read_ledger(ledger)
    counts = await tally(setup.database_url, executions, fleet.killed, acknowledged)
    connection = await asyncpg.connect(setup.database_url)
    try:
        ended = {row["id"]: (row["status"], row["attempt"]) for row in await connection.fetch(
            "SELECT id, status, attempt FROM agora.jobs WHERE id = ANY($1::bigint[])", list(acked))}
        # a handler that returned before the cancel reached it: done, by the attempt the cancel found
        finished_first = sorted(job_id for job_id in acked if ended.get(job_id) == ("done", acked[job_id]))
        forgotten = sorted(job_id for job_id in acked
                           if ended.get(job_id, ("",))[0] != "cancelled" and job_id not in finished_first)
        histories = [f"job {job_id} (cancel acknowledged at attempt {acked[job_id]}): " + "; ".join(
            f"attempt {run['attempt']} {run['status']} {run['error_type'] or ''}".strip()
            for run in await connection.fetch(
                "SELECT attempt, status, error_type FROM agora.runs WHERE job_id = $1 ORDER BY id", job_id))
            for job_id in forgotten[:3]]
    finally:
        await connection.close()
    ran_after = sorted({e.job_id for e in executions if e.job_id in acked and e.attempt > acked[e.job_id]})
    first = min((e.at for e in executions), default=storm_start)
    before = rate(executions, first, storm_start)
    # the drain after the storm, up to its last start (the final second runs fewer at once)
    last_start = max((e.at for e in executions if e.at >= storm_end), default=storm_end)
    after = rate(executions, storm_end, last_start) if last_start - storm_end >= 2.0 else before
    result = Result("cancels_under_kills", size.name, counts, before=round(before, 1), after=round(after, 1),
                    shape=False, notes={"kills": kills, "cancels_acknowledged": len(acked),
                                        "done_before_the_cancel_reached_them": len(finished_first),
                                        "jobs_per_s_before": round(before, 1), "drained": drained,
                                        "drain_seconds": round(drained_at - storm_end, 1), "stop_codes": codes})
    if len(acked) < cancels // 2:
        result.extra_violations.append(f"only {len(acked)} cancels acknowledged: the test proves little")
    if forgotten:
        result.extra_violations.append(f"acknowledged cancels not cancelled: {forgotten[:10]} ({len(forgotten)}); "
                                       + " | ".join(histories))
    if ran_after:
        result.extra_violations.append(f"jobs run again after their cancel was acknowledged: {ran_after[:10]}")
    if after < before / 2:
        result.extra_violations.append(f"the drain after the storm ran {after:.1f}/s, under half the {before:.1f}/s before")
    return result


def _note_reruns(result: Result, ledger: Path, fleet: Fleet) -> None:
    delays = rerun_delays(read_ledger(ledger), fleet.killed)
    if delays:
        result.notes["killed_jobs_rerun_after_s"] = f"max {max(delays):.1f}"


@contextlib.asynccontextmanager
async def private_database(setup: Setup, **server_settings: str) -> AsyncIterator[tuple[PrivateServer, str]]:
    """A server of the scenario's own (the embedded one), with ``server_settings`` (``ALTER
    SYSTEM``, then a restart), and a migrated database on it."""
    server = PrivateServer()
    try:
        admin = await asyncpg.connect(server.url())
        try:
            await admin.execute("CREATE DATABASE chaos")
            for name, value in server_settings.items():
                await admin.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        finally:
            await admin.close()
        if server_settings:
            await asyncio.to_thread(server.stop, "fast")
            await asyncio.to_thread(server.start)
        url = server.url("chaos")
        store = Store.open(Database(url), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()
        yield server, url
    finally:
        server.cleanup()


async def postgres_restart(setup: Setup, size: Size, mode: str, down_seconds: float) -> Result:
    """Workers, the API and a WorkerPool with five schedules on a server of the scenario's
    own, which is stopped (``mode``: fast or immediate) and started again after
    ``down_seconds``; nothing else is restarted. ``/ready`` must answer 503 during the
    outage and 200 after it; the schedules must run again after it, no tick twice."""
    async with private_database(setup) as (server, url):
        fleet, ledger = setup.fleet(url)
        fleet.start(2)
        await wait_workers(url, 2)
        pools, _ = setup.fleet(url, module="tests.chaos.chaos_pool")
        pools.start(1)
        api, base = await _start_api(setup, fleet.env)
        back: list[float] = []
        stopped: list[float] = []

        async def fault() -> dict[str, Any]:
            stopped.append(time.time())
            await asyncio.to_thread(server.stop, mode)
            await asyncio.sleep(0.5)
            during = await _ready_status(base)
            await asyncio.sleep(max(0.0, down_seconds - 0.5))
            await asyncio.to_thread(server.start)
            back.append(time.time())
            return {"ready_during_outage": during}

        async def after() -> dict[str, Any]:
            status = await _until(lambda: _ready_status(base), lambda status: status == 200, 30)
            return {"ready_after": status}

        name = f"postgres_restart_{mode}" + ("_held" if down_seconds > LEASE_SECONDS else "")
        result = await measure_flow(name, size, url, fleet, ledger, fault, after_drain=after)
        pool_codes = pools.stop()
        api.terminate()
        api.wait(30)
        result.notes["api_exit"] = api.returncode
        connection = await asyncpg.connect(url)
        try:
            twice = await _ticks_succeeded_twice(connection)
        finally:
            await connection.close()
    starts = sorted(run["start"] for run in _read_runs(ledger) if run["pipeline"] == "every_1s")
    # every_1s's pace (the median gap between its runs' starts) after the restart, against
    # its pace before the fault in the same run (a busy machine slows both alike)
    gaps_before = [b - a for a, b in itertools.pairwise(start for start in starts if start < stopped[0])]
    after = [start for start in starts if start > back[0]]
    pace_before = statistics.median(gaps_before) if gaps_before else 1.0 + 0.3  # (too few: the schedule's own)
    pace_after = statistics.median(b - a for a, b in itertools.pairwise(after)) if len(after) > 1 else None
    runs_after = len(after)
    result.notes.update(schedule_runs_after_restart=runs_after, pool_exit=pool_codes,
                        every_1s_gap_s_before_after=f"{pace_before:.2f}/{pace_after or 0:.2f}")
    if result.notes["ready_during_outage"] != 503 or result.notes["ready_after"] != 200:
        result.extra_violations.append(f"/ready answered {result.notes['ready_during_outage']} during the "
                                       f"outage and {result.notes['ready_after']} after it (503, then 200)")
    if api.returncode != 0:
        result.extra_violations.append(f"the API exited {api.returncode} at SIGTERM")
    if pool_codes != [0] or pools.killed:
        result.extra_violations.append(f"the WorkerPool did not live through the restart: exit {pool_codes}")
    if pace_after is None or runs_after < 3 or pace_after > 2 * pace_before:
        result.extra_violations.append(f"every_1s ran {runs_after} times after the restart, a run every "
                                       f"{pace_after} s against every {pace_before:.2f} s before the fault")
    if twice:
        result.extra_violations.append(f"schedule ticks that succeeded twice: {twice}")
    return result


async def _ticks_succeeded_twice(connection: asyncpg.Connection) -> list[str]:
    rows = await connection.fetch(
        "SELECT pipeline_id, scheduled_for, array_agg(id ORDER BY id) AS runs FROM agora.runs "
        "WHERE status = 'succeeded' AND pipeline_id IS NOT NULL GROUP BY 1, 2 HAVING count(*) > 1")
    return [f"{row['pipeline_id']}@{row['scheduled_for']}: runs {row['runs']}" for row in rows]


async def pool_exhaustion(setup: Setup, size: Size) -> Result:
    """Other clients take all but 5 of the server's connections (``max_connections`` 40)
    while jobs flow: workers degrade (refused connections are retried) and recover."""
    async with private_database(setup, max_connections="40") as (_server, url):
        fleet, ledger = setup.fleet(url)
        fleet.start(2)
        await wait_workers(url, 2)

        async def fault() -> dict[str, Any]:
            admin = await asyncpg.connect(url)
            try:
                in_use = await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'")
            finally:
                await admin.close()
            hogs = []
            for _ in range(max(0, 40 - 5 - in_use)):
                try:
                    hogs.append(await asyncpg.connect(url, timeout=5))
                except (asyncpg.PostgresError, OSError):
                    break
            await asyncio.sleep(size.fault)
            for hog in hogs:
                await hog.close()
            return {"connections_held": len(hogs)}

        return await measure_flow("pool_exhaustion", size, url, fleet, ledger, fault)


async def idle_in_tx(setup: Setup, size: Size) -> Result:
    """A session holds back vacuum (``BEGIN; SELECT txid_current();`` then idle) for
    ``size.held_transaction`` seconds while jobs flow. Reported beside the same flow
    without the held transaction (the baseline before it and the recovery after it):
    throughput, claim latency (a job's enqueue to its execution, p50/p99) and the dead
    tuples of agora.jobs and agora.runs (autovacuum every second on the scenario's own
    server)."""
    async with private_database(setup, autovacuum_naptime="1") as (_server, url):
        fleet, ledger = setup.fleet(url)
        fleet.start(2)
        await wait_workers(url, 2)
        before = await _dead_tuples(url)
        held: dict[str, float] = {}

        async def fault() -> dict[str, Any]:
            holder = await asyncpg.connect(url)
            try:
                await holder.execute("BEGIN; SELECT txid_current();")
                held["from"] = time.time()
                await asyncio.sleep(size.held_transaction)
                during = await _dead_tuples(url)
                await holder.execute("ROLLBACK")
                held["to"] = time.time()
            finally:
                await holder.close()
            return {"held_s": round(size.held_transaction), "dead_tuples_before": before, "dead_tuples_held": during}

        async def after() -> dict[str, Any]:
            await asyncio.sleep(3)  # an autovacuum round or two
            return {"dead_tuples_after": await _dead_tuples(url)}

        result = await measure_flow("idle_in_tx", size, url, fleet, ledger, fault, after_drain=after)
        windows = {"before": (held["from"] - size.baseline + 1.0, held["from"]), "held": (held["from"], held["to"]),
                   "after": (held["to"], held["to"] + size.recovery)}
        result.notes["claim_ms_p50/p99"] = await _claim_latency(url, ledger, windows)
        return result


async def _claim_latency(url: str, ledger: Path, windows: dict[str, tuple[float, float]]) -> str:
    """For the jobs enqueued in each window (start, end): p50/p99 milliseconds from the
    enqueue to the first execution."""
    first: dict[int, float] = {}
    for execution in read_ledger(ledger):
        first.setdefault(execution.job_id, execution.at)
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch("SELECT id, extract(epoch FROM created_at)::float8 AS enqueued FROM agora.jobs "
                                      "WHERE id = any($1::bigint[])", list(first))
    finally:
        await connection.close()
    parts = []
    for name, (start, end) in windows.items():
        latencies = sorted((first[row["id"]] - row["enqueued"]) * 1000 for row in rows if start <= row["enqueued"] < end)
        if latencies:
            p99 = latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))]
            parts.append(f"{name} {statistics.median(latencies):.0f}/{p99:.0f}")
    return ", ".join(parts)


async def _dead_tuples(url: str) -> str:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch("SELECT relname, n_dead_tup FROM pg_stat_user_tables "
                                      "WHERE schemaname = 'agora' AND relname IN ('jobs', 'runs') ORDER BY relname")
    finally:
        await connection.close()
    return "/".join(f"{row['relname']} {row['n_dead_tup']}" for row in rows)


async def active_readers(setup: Setup, size: Size) -> Result:
    """4 long REPEATABLE READ transactions scanning agora.runs again and again during the flow."""
    fleet, ledger = setup.fleet()
    fleet.start(2)
    await wait_workers(setup.database_url, 2)

    async def fault() -> dict[str, Any]:
        scans = 0
        deadline = time.monotonic() + size.fault

        async def reader() -> None:
            nonlocal scans
            connection = await asyncpg.connect(setup.database_url)
            try:
                async with connection.transaction(isolation="repeatable_read", readonly=True):
                    while time.monotonic() < deadline:
                        await connection.fetchval("SELECT count(*) FROM agora.runs WHERE finished_at IS NOT NULL")
                        scans += 1
            finally:
                await connection.close()

        await asyncio.gather(*(reader() for _ in range(4)))
        return {"scans": scans}

    return await measure_flow("active_readers", size, setup.database_url, fleet, ledger, fault)


async def server_errors(setup: Setup, size: Size) -> Result:
    """Errors the server reports that are not a lost connection: every running statement
    of the workers cancelled (``pg_cancel_backend``) every 0.3 s, agora.jobs locked
    (ACCESS EXCLUSIVE) for 2 s of it, and ``idle_session_timeout`` of 500 ms on the
    database. Workers stay up and lose nothing."""
    fleet, ledger = setup.fleet()
    fleet.start(2)
    await wait_workers(setup.database_url, 2)

    async def fault() -> dict[str, Any]:
        cancelled = 0
        admin = await asyncpg.connect(setup.database_url)
        locker = await asyncpg.connect(setup.database_url)
        # connections idle for 500 ms are closed by the server (the workers' pooled ones
        # get the setting as they reconnect after the termination below)
        await admin.execute("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET idle_session_timeout = 500', "
                            "current_database()); END $$")
        await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
                            "current_database() AND pid NOT IN (pg_backend_pid(), $1)", locker.get_server_pid())
        try:
            deadline = time.monotonic() + size.fault
            lock_at = time.monotonic() + size.fault / 3
            locked = False
            while time.monotonic() < deadline:
                cancelled += await admin.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_cancel_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid NOT IN (pg_backend_pid(), $1) AND state = 'active' "
                    "AND query NOT ILIKE '%LISTEN%'", locker.get_server_pid())
                if not locked and time.monotonic() >= lock_at:
                    locked = True
                    await locker.execute("BEGIN; LOCK TABLE agora.jobs IN ACCESS EXCLUSIVE MODE")
                    asyncio.get_running_loop().call_later(2.0, lambda: asyncio.ensure_future(locker.execute("COMMIT")))
                await asyncio.sleep(0.3)
        finally:
            await admin.execute("DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET idle_session_timeout', "
                                "current_database()); END $$")
            await admin.close()
            await locker.close()
        return {"statements_cancelled": cancelled}

    return await measure_flow("server_errors", size, setup.database_url, fleet, ledger, fault)


async def role_connection_limit(setup: Setup, size: Size) -> Result:
    """Workers log in as a role with a connection limit. For the fault, the limit is
    lowered to the connections the role holds less its LISTEN connections, and those are
    terminated: the listeners' reconnections (and any other new connection of the
    workers) are refused (too many connections for role) until the limit is raised again.
    Workers stay up, keep working on the connections they hold and lose nothing; after
    the fault the listeners are back (workers poll only every 5 s, so a missing listener
    shows in the wake-up latency)."""
    async with private_database(setup) as (_server, url):
        admin = await asyncpg.connect(url)
        try:
            await admin.execute("CREATE ROLE chaos_worker LOGIN CONNECTION LIMIT 50")
            await admin.execute("GRANT pg_read_all_data, pg_write_all_data TO chaos_worker")
        finally:
            await admin.close()
        worker_url = url.replace("postgresql://postgres@", "postgresql://chaos_worker@", 1)
        fleet, ledger = setup.fleet(worker_url, WORKER_POLL_SECONDS="5")
        fleet.start(2)
        await wait_workers(url, 2)
        before = statistics.median([await wake_up_latency(url, ledger) for _ in range(3)])

        async def fault() -> dict[str, Any]:
            admin = await asyncpg.connect(url)
            try:
                held, listeners = await admin.fetchrow(
                    "SELECT count(*), count(*) FILTER (WHERE query ILIKE 'LISTEN%') FROM pg_stat_activity "
                    "WHERE usename = 'chaos_worker'")
                await admin.execute(f"ALTER ROLE chaos_worker CONNECTION LIMIT {held - listeners}")
                await admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE usename = 'chaos_worker' AND query ILIKE 'LISTEN%'")
                await asyncio.sleep(size.fault)
                await admin.execute("ALTER ROLE chaos_worker CONNECTION LIMIT 50")
            finally:
                await admin.close()
            return {"role_limit": held - listeners, "listeners_terminated": listeners}

        async def after() -> dict[str, Any]:
            await asyncio.sleep(1.0)  # the listeners' reconnection pause
            latencies = [await wake_up_latency(url, ledger) for _ in range(3)]
            return {"wake_up_ms_before": round(before * 1000),
                    "wake_up_ms_after": round(statistics.median(latencies) * 1000)}

        result = await measure_flow("role_connection_limit", size, url, fleet, ledger, fault, after_drain=after)
    refusals = sum(path.read_text(errors="replace").count("too many connections for role")
                   for path in (setup.workdir / "logs").glob("*.log"))
    result.notes["refused_reconnects_logged"] = refusals
    if not result.notes["listeners_terminated"] or not refusals:
        result.extra_violations.append("no listener reconnect was refused: the fault did not happen")
    if result.notes["wake_up_ms_after"] > max(1000, 3 * result.notes["wake_up_ms_before"]):
        result.extra_violations.append(f"wake-up after the fault {result.notes['wake_up_ms_after']} ms")
    return result


async def lost_reply(setup: Setup, size: Size) -> Result:
    """One of 2 workers reaches the server through a TCP proxy that, three times, lets a
    claim commit and drops its reply (and the connection): the claimed jobs run once,
    soon, without being charged an attempt."""
    host, port, dbname = _server_of(setup.database_url)
    proxy = PgProxy(host, port).start()
    try:
        fleet, ledger = setup.fleet()
        fleet.start(1)
        fleet.env = {**fleet.env, "AGORA_PG_DATABASE_URL": proxy.url(dbname)}
        fleet.start(1)
        await wait_workers(setup.database_url, 2)

        async def fault() -> dict[str, Any]:
            for _ in range(3):
                proxy.lose_reply_to(b"SET status = 'processing'")
                await asyncio.sleep(size.fault / 3)
            return {"replies_lost": proxy.replies_lost}

        result = await measure_flow("lost_reply", size, setup.database_url, fleet, ledger, fault)
    finally:
        proxy.release()
        await asyncio.to_thread(proxy.close)  # (it runs its own loop to a close: not on this one)
    connection = await asyncpg.connect(setup.database_url)
    try:
        charged = await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE kind = 'work' AND (retry_count > 0 OR lost_count > 0)")
    finally:
        await connection.close()
    result.notes["jobs_charged_an_attempt"] = charged
    if result.notes["replies_lost"] == 0:
        result.extra_violations.append("no reply was lost: the fault did not happen")
    if charged:
        result.extra_violations.append(f"{charged} jobs were charged an attempt")
    return result


FROZEN_QUEUE_CONCURRENCY = 12  # the "default" queue's limits in frozen_claimer (config-declared)
FROZEN_QUEUE_RATE = 300  # starts per second: above the flow, so the limits, not the flow, are tested by bursts


async def frozen_claimer(setup: Setup, size: Size) -> Result:
    """5 workers drain the flow through a queue limited to 12 running jobs and 300 starts a
    second; two reach the server through proxies. During the fault one is cut off in the
    middle of a claim (its proxy passes the claim's statement, which the server runs, then
    nothing more on that connection) and the other is cut off the same way and then stopped
    with SIGSTOP; pg_stat_activity shows both backends have run the claim. So they stay for
    the fault (3 minutes at full size); then the stopped one is killed and the other let
    through. The three others keep the queue draining: a claim never waits for a lock,
    and no run interval of agora.runs ever overlaps more than the limit."""
    host, port, dbname = _server_of(setup.database_url)
    cut_off, frozen = PgProxy(host, port).start(), PgProxy(host, port).start()
    store = Store.open(Database(setup.database_url), pool_size=1)
    try:
        await store.jobs.declare_queue_limits(
            {"default": QueueLimit(FROZEN_QUEUE_CONCURRENCY, (FROZEN_QUEUE_RATE, 1.0))}, config=True)
    finally:
        await store.close()
    seconds = size.fault if size.name == "short" else 180.0
    try:
        fleet, ledger = setup.fleet()
        fleet.start(3)
        fleet.start(1, AGORA_PG_DATABASE_URL=cut_off.url(dbname))
        fleet.start(1, AGORA_PG_DATABASE_URL=frozen.url(dbname))
        stopped = fleet.workers[-1]
        await wait_workers(setup.database_url, 5)

        async def fault() -> dict[str, Any]:
            cut_off.hold_reply_to(b"claim_limited_jobs")
            frozen.hold_reply_to(b"claim_limited_jobs")
            await _until(lambda: asyncio.sleep(0, cut_off.replies_held + frozen.replies_held), lambda n: n >= 2, 15)
            stopped.send_signal(signal.SIGSTOP)
            frozen.release()  # (its reply reaches a stopped process)
            inside = await _claims_run_by(setup.database_url, cut_off.held_pids + frozen.held_pids)
            await asyncio.sleep(seconds)
            stopped.kill()
            fleet.killed[stopped.pid] = time.time()
            cut_off.release()
            return {"held_claims": cut_off.replies_held + frozen.replies_held, "backends_after_the_claim": inside,
                    "frozen_seconds": seconds}

        result = await measure_flow("frozen_claimer", size, setup.database_url, fleet, ledger, fault)
    finally:
        for proxy in (cut_off, frozen):
            proxy.release()
            await asyncio.to_thread(proxy.close)
    connection = await asyncpg.connect(setup.database_url)
    try:
        peak = await connection.fetchval(_PEAK_RUNNING, "default")
        busiest_second = await connection.fetchval(_MOST_STARTS_IN_A_SECOND, "default")
    finally:
        await connection.close()
    result.notes.update(peak_running_in_queue=peak, most_starts_in_a_second=busiest_second)
    if result.notes["held_claims"] < 2 or result.notes["backends_after_the_claim"] < 2:
        result.extra_violations.append("the freeze did not land in a claim: the fault did not happen")
    if peak > FROZEN_QUEUE_CONCURRENCY:
        connection = await asyncpg.connect(setup.database_url)
        try:
            at = await connection.fetchval(_PEAK_AT, "default")
            overlapping = [tuple(row) for row in await connection.fetch(
                "SELECT r.job_id, r.attempt, r.status, r.worker_id, r.started_at, r.finished_at FROM agora.runs AS r "
                "WHERE r.started_at <= $1 AND COALESCE(r.finished_at, now()) > $1 ORDER BY r.started_at", at)]
        finally:
            await connection.close()
        result.extra_violations.append(f"{peak} runs of the queue overlapped (limit {FROZEN_QUEUE_CONCURRENCY}) "
                                       f"at {at}: {overlapping}")
    if busiest_second > FROZEN_QUEUE_RATE:
        result.extra_violations.append(f"{busiest_second} runs started within a second (limit {FROZEN_QUEUE_RATE})")
    return result


# The most runs of queue $1 whose intervals (started_at to finished_at; a run in progress to
# now) overlap at one instant: a SQL audit of a concurrency limit (ends count before starts).
_PEAK_RUNNING = """
WITH events AS (
    SELECT r.started_at AS t, 1 AS change FROM agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id
    WHERE j.queue = $1
    UNION ALL
    SELECT COALESCE(r.finished_at, now()), -1 FROM agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id
    WHERE j.queue = $1
)
SELECT COALESCE(max(running), 0) FROM (
    SELECT sum(change) OVER (ORDER BY t, change ROWS UNBOUNDED PRECEDING) AS running FROM events
) AS counted
"""
# The first instant at which _PEAK_RUNNING's most runs ran (to show them).
_PEAK_AT = (_PEAK_RUNNING.replace("COALESCE(max(running), 0)", "(array_agg(t ORDER BY running DESC, t))[1]")
            .replace("SELECT sum(change)", "SELECT t, sum(change)"))
# The most runs of queue $1 that started within any 1 s window (each run's start opens one).
_MOST_STARTS_IN_A_SECOND = """
SELECT COALESCE(max(n), 0) FROM (
    SELECT count(*) OVER (ORDER BY r.started_at RANGE BETWEEN CURRENT ROW AND interval '0.999999 seconds' FOLLOWING) AS n
    FROM agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id WHERE j.queue = $1
) AS windows
"""


async def _claims_run_by(url: str, pids: list[int]) -> int:
    """Of the backends ``pids``, those whose last statement was a claim: the server ran it,
    whatever became of its client."""
    connection = await asyncpg.connect(url)
    try:
        return int(await connection.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1::int[]) AND query LIKE '%claim_limited_jobs%'",
            pids))
    finally:
        await connection.close()


async def network_stall(setup: Setup, size: Size) -> Result:
    """One of 2 workers reaches the server through a TCP proxy that holds all traffic
    (nothing refused, nothing answered) for the whole fault; a second into the stall the
    worker gets SIGTERM and must exit within its bound (grace period, then every database
    step's deadline) although the database never answers it; a replacement starts."""
    host, port, dbname = _server_of(setup.database_url)
    proxy = PgProxy(host, port).start()
    # WORKER_SHUTDOWN_TIMEOUT, 2 x AGORA_PG_DATABASE_TIMEOUT, the lease, 2 s to exit: the sum of
    # the shutdown's deadlines, which a busy machine does not lengthen (it takes 7-8 s: after
    # the grace period one step waits its deadline, the later ones are skipped)
    bound = 3.0 + 2 * 5.0 + LEASE_SECONDS + 2.0
    try:
        fleet, ledger = setup.fleet(WORKER_SHUTDOWN_TIMEOUT="3")
        fleet.start(1)
        fleet.start(1, AGORA_PG_DATABASE_URL=proxy.url(dbname))
        stalled = fleet.workers[-1]
        await wait_workers(setup.database_url, 2)

        async def fault() -> dict[str, Any]:
            proxy.hold()
            await asyncio.sleep(1.0)
            stalled.send_signal(signal.SIGTERM)
            sent = time.monotonic()
            fleet.start(1)  # its replacement, straight to the server
            exit_seconds = None
            while time.monotonic() - sent < max(size.fault, bound + 1):
                if stalled.poll() is not None:
                    exit_seconds = round(time.monotonic() - sent, 1)
                    break
                await asyncio.sleep(0.1)
            await asyncio.sleep(max(0.0, size.fault - (time.monotonic() - sent) - 1.0))
            proxy.release()
            return {"stalled_worker_exit_s": exit_seconds, "stalled_worker_code": stalled.poll()}

        result = await measure_flow("network_stall", size, setup.database_url, fleet, ledger, fault)
    finally:
        proxy.release()
        await asyncio.to_thread(proxy.close)
    seconds = result.notes["stalled_worker_exit_s"]
    if seconds is None or seconds > bound:
        result.extra_violations.append(f"the stalled worker exited after {seconds} s (bound {bound} s)")
    return result


async def pgbouncer(setup: Setup, size: Size) -> Result:
    """Workers and the API reach the server through PgBouncer in transaction pooling mode,
    with the documented settings (``AGORA_PG_TRANSACTION_POOLING=on``; LISTEN straight to
    the server through ``AGORA_PG_LISTEN_DATABASE_URL`` for two workers, none for the
    third, which polls). The fault: a worker killed with SIGKILL (and replaced), then
    PgBouncer itself killed with SIGKILL and started again a second later. Jobs posted to
    the API before and after the fault run; ``/ready`` is 200 after it."""
    if shutil.which("pgbouncer") is None:
        raise ScenarioSkipped("pgbouncer is not installed (apt-get install -y pgbouncer; .ci/run installs it)")
    async with private_database(setup) as (server, url):
        bouncer = PgBouncer(server.directory / "pgbouncer", server.socket_dir, server.port,
                            run_as=server.system_user).start()
        try:
            bounced = bouncer.url("chaos")
            fleet, ledger = setup.fleet(bounced, AGORA_PG_TRANSACTION_POOLING="on", AGORA_PG_LISTEN_DATABASE_URL=url)
            fleet.start(2)
            listening_env = fleet.env
            fleet.env = {k: v for k, v in fleet.env.items() if k != "AGORA_PG_LISTEN_DATABASE_URL"}
            fleet.start(1)
            fleet.env = listening_env
            await wait_workers(url, 3)
            api, base = await _start_api(setup, fleet.env)
            posted = [await _post_job(base)]
            rng = random.Random(setup.seed)

            async def fault() -> dict[str, Any]:
                fleet.kill_random(rng)
                fleet.start(1)
                await asyncio.sleep(size.fault / 2)
                await asyncio.to_thread(bouncer.kill)
                await asyncio.sleep(1.0)
                await asyncio.to_thread(bouncer.start)
                await asyncio.sleep(max(0.0, size.fault / 2 - 1.0))
                return {}

            async def after() -> dict[str, Any]:
                posted.append(await _until(lambda: _post_job(base), lambda job_id: job_id is not None, 30))
                ready = await _until(lambda: _ready_status(base), lambda status: status == 200, 30)
                await wait_drained(url, 30)
                return {"ready_after": ready}

            result = await measure_flow("pgbouncer", size, url, fleet, ledger, fault, after_drain=after)
            api.terminate()
            api.wait(30)
        finally:
            bouncer.stop()
        connection = await asyncpg.connect(url)
        try:
            posted_status = [await connection.fetchval("SELECT status FROM agora.jobs WHERE id = $1", job_id)
                             for job_id in posted if job_id is not None]
        finally:
            await connection.close()
    result.notes.update(api_jobs=posted_status, api_exit=api.returncode)
    if posted_status != ["done", "done"]:
        result.extra_violations.append(f"jobs posted to the API through PgBouncer: {posted} {posted_status}")
    if result.notes["ready_after"] != 200 or api.returncode != 0:
        result.extra_violations.append(f"/ready {result.notes['ready_after']} after the fault, API exit {api.returncode}")
    return result


async def _post_job(base: str) -> int | None:
    try:
        async with httpx.AsyncClient(timeout=5) as client:
            response = await client.post(f"{base}/jobs", json={"kind": "work", "payload": {"seconds": 0}})
    except httpx.HTTPError:
        return None
    return int(response.json()["id"]) if response.status_code == 201 else None


def _server_of(url: str) -> tuple[str, int, str]:
    """(host or socket directory, port, database) of a libpq-style URL."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host = parts.hostname or query.get("host", ["127.0.0.1"])[0]
    port = parts.port or int(query.get("port", ["5432"])[0])
    return host, port, parts.path.lstrip("/")


async def _start_api(setup: Setup, env: dict[str, str]) -> tuple[subprocess.Popen[bytes], str]:
    """``agora-pg api`` on a free port with ``env``, once ready: (the process, its base URL)."""
    port = free_port()
    api = subprocess.Popen([sys.executable, "-m", "agora_pg.cli", "api", "--port", str(port)], env=env, cwd=REPO,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    setup.track(api)
    base = f"http://127.0.0.1:{port}"
    await _until(lambda: _ready_status(base), lambda status: status == 200, 30)
    return api, base


async def _ready_status(base: str) -> int:
    try:
        async with httpx.AsyncClient(timeout=3) as client:
            return (await client.get(f"{base}/ready")).status_code
    except httpx.HTTPError:
        return 0


async def _until(probe: Callable[[], Awaitable[Any]], done: Callable[[Any], bool], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    value = await probe()
    while not done(value) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        value = await probe()
    return value


async def pg_backend_kill(setup: Setup, size: Size) -> Result:
    """Every agora-pg backend of the database (the workers' LISTEN connections included)
    terminated every 0.5 s while jobs flow. Workers poll only every 5 s here, so a listener
    that did not subscribe again would show in the wake-up latency after the fault."""
    fleet, ledger = setup.fleet(WORKER_POLL_SECONDS="5")
    fleet.start(2)
    await wait_workers(setup.database_url, 2)
    before = statistics.median([await wake_up_latency(setup.database_url, ledger) for _ in range(3)])

    async def fault() -> dict[str, Any]:
        killed = 0
        deadline = time.monotonic() + size.fault
        admin = await asyncpg.connect(setup.database_url)
        try:
            while time.monotonic() < deadline:
                killed += await admin.fetchval(
                    "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()")
                await asyncio.sleep(0.5)
        finally:
            await admin.close()
        return {"backends_terminated": killed}

    async def after() -> dict[str, Any]:
        await asyncio.sleep(1.0)  # the listeners' reconnection pause
        latencies = [await wake_up_latency(setup.database_url, ledger) for _ in range(3)]
        return {"wake_up_ms_before": round(before * 1000), "wake_up_ms_after": round(statistics.median(latencies) * 1000)}

    result = await measure_flow("pg_backend_kill", size, setup.database_url, fleet, ledger, fault, after_drain=after)
    if result.notes["wake_up_ms_after"] > max(1000, 3 * result.notes["wake_up_ms_before"]):
        result.extra_violations.append(f"wake-up after the fault {result.notes['wake_up_ms_after']} ms")
    return result


async def event_burst(setup: Setup, size: Size) -> Result:
    """``size.burst`` jobs enqueued in 2 s (batches of 1,000, paced evenly) while 2
    workers drain; then the wake-up latency of a single job."""
    fleet, ledger = setup.fleet()
    fleet.start(2)
    await wait_workers(setup.database_url, 2)
    store = Store.open(Database(setup.database_url), pool_size=1)
    acknowledged: list[int] = []
    try:
        started = time.time()
        batches = range(0, size.burst, 1000)
        for number, offset in enumerate(batches):
            await asyncio.sleep(max(0.0, started + 2.0 * number / len(batches) - time.time()))
            batch = [JobSpec("work", {"seconds": 0}) for _ in range(min(1000, size.burst - offset))]
            acknowledged += [job.id for job, _ in await store.jobs.enqueue(batch)]
        enqueue_seconds = time.time() - started
    finally:
        await store.close()
    drained = await wait_drained(setup.database_url, 300)
    drain_seconds = time.time() - started
    fleet.sample_rss()
    latency = await wake_up_latency(setup.database_url, ledger)
    codes = fleet.stop()
    executions = read_ledger(ledger)
    result = Result("event_burst", size.name, await tally(setup.database_url, executions, fleet.killed, acknowledged),
                    shape=False, peak_rss_mb=round(fleet.peak_rss / 2**20, 1))
    result.after = round(len(executions) / max(drain_seconds, 0.001), 1)
    result.notes.update(enqueue_s=round(enqueue_seconds, 2), drain_s=round(drain_seconds, 1), drained=drained,
                        wake_up_ms_after=round(latency * 1000), stop_codes=codes)
    return result


async def bad_handlers(setup: Setup, size: Size) -> Result:
    """Among a steady flow, jobs whose handlers raise an error with text PostgreSQL cannot
    hold, hang past their timeout (async, and sync: whose worker then stops to be
    restarted), or kill their own process; workers that die are replaced, as a process
    supervisor would. Each bad job must end ``failed`` with its own reason recorded, and
    the flow goes on.

    The worker whose sync thread is stuck stops as at SIGTERM: its other running attempts
    end within the grace period and are recorded with their own outcomes; none is left for
    its lease to expire (no ``WorkerLost``), and it holds no job when it exits. So that they
    share its worker, the stuck job, two hang jobs and four 3 s jobs are enqueued in a
    queue of their own (``stuck``), which only a fourth worker claims, started after them:
    its first claim takes them together. They must end timed out, timed out, succeeded."""
    fleet, ledger = setup.fleet()
    fleet.start(3)
    await wait_workers(setup.database_url, 3)
    bad: dict[str, list[int]] = {}
    beside: list[int] = []  # the 3 s jobs enqueued with the stuck one

    async def fault() -> dict[str, Any]:
        store = Store.open(Database(setup.database_url), pool_size=1)
        try:
            # Each phase's jobs first end: claimed in one batch with the exit jobs, a bad job
            # could die with its worker three times and end WorkerLost (as it should) instead
            # of showing its own outcome.
            for phase in (("poison",), ("hang_sync", "hang", "beside"), ("exit",)):
                stuck = "hang_sync" in phase
                specs = [JobSpec(kind, {"seconds": 3.0} if kind == "beside" else {}, queue="stuck" if stuck else "default",
                                 max_retries=3 if kind == "exit" else 0)
                         for kind in phase for _ in range({"beside": 4, "hang_sync": 1}.get(kind, 2))]
                ids = [job.id for job, _ in await store.jobs.enqueue(specs)]
                for spec, job_id in zip(specs, ids):
                    (beside if spec.kind == "beside" else bad.setdefault(spec.kind, [])).append(job_id)
                if stuck:  # the only worker of the queue "stuck" (its replacement claims "default" only)
                    fleet.start(1, WORKER_QUEUES="default,stuck")
                if phase != ("exit",):  # (until none of them waits, runs or waits for a retry)
                    await _until(lambda: waiting_jobs(setup.database_url, ids), lambda left: left == 0, 60)
        finally:
            await store.close()
        await asyncio.sleep(size.fault)  # (dead workers are replaced by measure_flow's supervision)
        return {}

    async def after() -> dict[str, Any]:
        for _ in range(50):  # the last deaths' replacements
            fleet.replace_dead()
            if await wait_drained(setup.database_url, 0.3):
                break
        connection = await asyncpg.connect(setup.database_url)
        try:
            rows = await connection.fetch("SELECT id, kind, status, error_message, lost_count FROM agora.jobs "
                                          "WHERE kind NOT IN ('work', 'beside') ORDER BY id")
            stuck = await connection.fetchval("SELECT worker_id FROM agora.runs WHERE job_id = $1", bad["hang_sync"][0])
            of_stuck = await connection.fetch(
                "SELECT r.job_id, j.kind, r.status, r.error_type FROM agora.runs AS r JOIN agora.jobs AS j "
                "ON j.id = r.job_id WHERE r.worker_id = $1 AND r.job_id <> $2 ORDER BY r.id", stuck, bad["hang_sync"][0])
            still_held = await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE locked_by = $1", stuck)
        finally:
            await connection.close()
        outcomes = {f"{row['kind']}": f"{row['status']}" for row in rows}
        return {"bad_jobs": outcomes, "_bad_rows": [dict(row) for row in rows],
                "_of_stuck": [dict(row) for row in of_stuck], "_still_held": still_held}

    result = await measure_flow("bad_handlers", size, setup.database_url, fleet, ledger, fault, after_drain=after,
                                supervise=True)
    rows = result.notes.pop("_bad_rows")
    of_stuck, still_held = result.notes.pop("_of_stuck"), result.notes.pop("_still_held")
    for row in rows:
        if row["status"] != "failed" or not row["error_message"]:
            result.extra_violations.append(f"{row['kind']} job {row['id']} ended {row['status']}")
        elif row["kind"] == "hang" and "JobTimeout" not in row["error_message"]:
            result.extra_violations.append(f"hang job {row['id']}: {row['error_message'][:200]}")
        elif row["kind"] == "hang_sync" and not ("JobTimeout" in row["error_message"]
                                                 and "was left running" in row["error_message"]):
            result.extra_violations.append(f"hang_sync job {row['id']}: {row['error_message'][:200]}")
        elif row["kind"] == "exit" and row["lost_count"] < 3:
            result.extra_violations.append(f"exit job {row['id']}: lost_count {row['lost_count']}")
        elif row["kind"] == "poison" and "ValueError: bad" not in row["error_message"]:
            result.extra_violations.append(f"poison job {row['id']}: {row['error_message'][:80]}")
    # the stuck worker's other attempts: each recorded with its own outcome, none left to its lease
    result.notes["beside_the_stuck_thread"] = ", ".join(
        f"{run['kind']} {run['status']}" for run in of_stuck if run["kind"] in ("hang", "beside")) or "none"
    lost = [run for run in of_stuck if run["status"] == "abandoned"]
    if lost or still_held:
        result.extra_violations.append(f"the worker stopped for a stuck thread left attempts to their leases: "
                                       f"{lost[:5]}, {still_held} jobs still held")
    if not any(run["kind"] == "beside" and run["status"] == "succeeded" for run in of_stuck):
        result.extra_violations.append(f"no job ran beside the stuck thread in its worker: the test proves little "
                                       f"({of_stuck[:10]})")
    return result


async def schedules_under_faults(setup: Setup, size: Size) -> Result:
    """3 WorkerPool processes share five schedules (every 1 s, every 2 s, cron each minute,
    continuous, once with a key) while a random one is killed and replaced every 3 s and
    the server restarts once: no run executes twice, no two runs of a pipeline overlap,
    the once schedule runs once, and the schedules keep their state."""
    async with private_database(setup) as (server, url):
        fleet, ledger = setup.fleet(url, module="tests.chaos.chaos_pool")
        fleet.start(3)
        rng = random.Random(setup.seed)
        started = time.time()
        await asyncio.sleep(size.baseline)
        deadline = time.monotonic() + size.fault
        kills = 0
        restarted = False
        while time.monotonic() < deadline:
            fleet.sample_rss()
            fleet.kill_random(rng)
            fleet.start(1)
            kills += 1
            if not restarted and time.monotonic() > deadline - size.fault / 2:
                restarted = True
                await asyncio.to_thread(server.stop, "immediate")
                await asyncio.sleep(1.0)
                await asyncio.to_thread(server.start)
            await asyncio.sleep(3.0)
        await asyncio.sleep(size.recovery)
        codes = fleet.stop()
        ended = time.time()
        connection = await asyncpg.connect(url)
        try:
            runs = await connection.fetch("SELECT pipeline_id, status, count(*) AS n FROM agora.runs "
                                          "GROUP BY 1, 2 ORDER BY 1, 2")
            schedules = await connection.fetch("SELECT pipeline_id, state, consecutive_errors FROM agora.schedules")
            twice = await _ticks_succeeded_twice(connection)
            status_of = {str(row["job_id"]): row["status"] for row in await connection.fetch(  # (a run is a job)
                "SELECT job_id, status FROM agora.runs WHERE pipeline_id IS NOT NULL AND job_id IS NOT NULL")}
        finally:
            await connection.close()
    executions = _read_runs(ledger)
    # (the counts here are of pipeline runs: started, and finished their work)
    result = Result("schedules_under_faults", size.name, Tally(0, 0, 0, 0, 0, 0, 0, 0), shape=False)
    result.tally = dataclasses.replace(result.tally, enqueued=len(executions),
                                       done=sum(1 for e in executions if e["end"] is not None))
    by_run: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for execution in executions:
        by_run.setdefault((execution["pipeline"], execution["run"]), []).append(execution)
    again = [key for key, runs_of in by_run.items() if len(runs_of) > 1]
    overlaps = []
    for pipeline_id in {e["pipeline"] for e in executions}:
        spans = sorted((e["start"], e["end"] or fleet.killed.get(e["pid"], ended), e["pid"]) for e in executions
                       if e["pipeline"] == pipeline_id)
        overlaps += [(pipeline_id, a, b) for a, b in zip(spans, spans[1:]) if b[0] < a[1] - 0.001]
    once_runs = sum(1 for e in executions if e["pipeline"] == "once_ever" and status_of.get(e["run"]) == "succeeded")
    # a run that finished its work but is not recorded succeeded was cut short by a kill or a lost lease
    unexplained = [e for e in executions if e["end"] is not None and status_of.get(e["run"]) != "succeeded"
                   and e["pid"] not in fleet.killed and status_of.get(e["run"]) not in ("abandoned", "cancelled")]
    per_pipeline = {p: sum(1 for e in executions if e["pipeline"] == p) for p in sorted({e["pipeline"] for e in executions})}
    result.peak_rss_mb = round(fleet.peak_rss / 2**20, 1)
    result.notes.update(counts="pipeline runs", kills=kills, server_restarts=int(restarted), runs_executed=per_pipeline,
                        run_rows=",".join(f"{r['pipeline_id']}:{r['status']}={r['n']}" for r in runs),
                        seconds=round(ended - started), stop_codes=codes)
    states = {row["pipeline_id"]: row["state"] for row in schedules}
    if again:
        result.extra_violations.append(f"runs executed twice: {again[:5]}")
    if overlaps:
        result.extra_violations.append(f"overlapping runs: {overlaps[:3]}")
    if twice:
        result.extra_violations.append(f"ticks that succeeded twice: {twice}")
    if once_runs != 1:
        result.extra_violations.append(f"the once schedule succeeded {once_runs} times")
    if unexplained:
        result.extra_violations.append(f"runs that ended without a recorded success: {unexplained[:3]}")
    if states.get("once_ever") != "completed" or any(states.get(p) != "active" for p in per_pipeline if p != "once_ever"):
        result.extra_violations.append(f"schedule states after the chaos: {states}")
    if any(per_pipeline.get(p, 0) < 2 for p in ("every_1s", "continuous")):
        result.extra_violations.append(f"pipelines did not keep running: {per_pipeline}")
    return result


def _read_runs(ledger: Path) -> list[dict[str, Any]]:
    """Each run's start with its end (None: cut short by a kill or stopped)."""
    starts: dict[tuple[str, str, int], dict[str, Any]] = {}
    for path in ledger.glob("*.runs"):
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue
            pipeline_id, run_id, pid, event, at = parts[0], parts[1], int(parts[2]), parts[3], float(parts[4])
            key = (pipeline_id, run_id, pid)
            if event == "start":
                starts[key] = {"pipeline": pipeline_id, "run": run_id, "pid": pid, "start": at, "end": None}
            elif key in starts:
                starts[key]["end"] = at
    return list(starts.values())


SCENARIOS: dict[str, Callable[[Setup, Size], Awaitable[Result]]] = {
    "crash_recovery": crash_recovery,
    "repeated_kills": repeated_kills,
    "limits_under_kills": limits_under_kills,
    "cancels_under_kills": cancels_under_kills,
    "postgres_restart_fast": lambda setup, size: postgres_restart(setup, size, "fast", 1.0),
    "postgres_restart_immediate": lambda setup, size: postgres_restart(setup, size, "immediate", 1.0),
    "postgres_restart_held": lambda setup, size: postgres_restart(setup, size, "fast", LEASE_SECONDS + 3.0),
    "pg_backend_kill": pg_backend_kill,
    "pool_exhaustion": pool_exhaustion,
    "idle_in_tx": idle_in_tx,
    "event_burst": event_burst,
    "active_readers": active_readers,
    "lost_reply": lost_reply,
    "bad_handlers": bad_handlers,
    "server_errors": server_errors,
    "role_connection_limit": role_connection_limit,
    "network_stall": network_stall,
    "schedules_under_faults": schedules_under_faults,
    "pgbouncer": pgbouncer,
    "frozen_claimer": frozen_claimer,
}
