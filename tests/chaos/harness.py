"""The chaos harness: a fleet of worker processes, a steady producer, the ledger of
executions, and the tally that every scenario is judged by.

A scenario has the shape of the public chaos harness (hardbyte/postgresql-job-queue-
benchmarking): warm-up and baseline, the fault, recovery; throughput is measured from
the ledger (executions per second), before, during and after the fault.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.job_spec import JobSpec

REPO = Path(__file__).resolve().parents[2]
WORKER_MODULE = "tests.chaos.chaos_app"
RECOVERY_SHARE = 0.9  # recovered: throughput back to 90 % of the baseline...
RECOVERY_LIMIT_SECONDS = 10.0  # ...within 10 s of the fault ending
# The workers' lease: renewed every 2 s, a renewal given up after 2 s and the attempt
# stopped after 4.5 s without one, so a busy machine's stalls of a few seconds (a renewal
# waiting on a loaded server) do not end attempts; a killed worker's jobs wait 6 s.
LEASE_SECONDS = 6.0


@dataclasses.dataclass(frozen=True)
class Size:
    """How long each phase lasts and how fast jobs arrive."""

    name: str
    baseline: float  # seconds of steady flow before the fault (the first second is warm-up)
    fault: float  # seconds the fault lasts (for faults that last)
    recovery: float  # seconds of flow after the fault
    rate: float  # jobs enqueued per second
    burst: int  # jobs of the event_burst scenario, enqueued over 2 s
    held_transaction: float  # seconds the idle_in_tx scenario holds its transaction open
    job_seconds: float = 0.02  # each job's work


SHORT = Size("short", baseline=3.0, fault=6.0, recovery=11.0, rate=80.0, burst=10_000, held_transaction=8.0)
FULL = Size("full", baseline=30.0, fault=60.0, recovery=60.0, rate=200.0, burst=50_000, held_transaction=240.0)


def chaos_env(database_url: str, ledger_dir: Path, **extra: str) -> dict[str, str]:
    """A worker's environment: only the settings the scenario gives (``LEASE_SECONDS``)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(
        AGORA_PG_DATABASE_URL=database_url, CHAOS_LEDGER_DIR=str(ledger_dir), WORKER_LEASE_SECONDS=f"{LEASE_SECONDS:g}",
        WORKER_POLL_SECONDS="0.5", WORKER_RETRY_BACKOFF_SECONDS="0", WORKER_CONCURRENCY="10",
        AGORA_PG_LOG_LEVEL="WARNING", AGORA_PG_DATABASE_TIMEOUT="5", PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    env.update(extra)
    return env


class Fleet:
    """Worker processes (``agora-pg worker --module tests.chaos.chaos_app``), each with its
    output in a file; ``kill_random`` kills one with SIGKILL; ``replace_dead`` starts a new
    one for each that died, as a process supervisor would. Every process is registered
    with ``track`` so that the test's teardown kills whatever is left, by pid."""

    def __init__(self, env: dict[str, str], log_dir: Path, track: Callable[[subprocess.Popen[bytes]], None],
                 module: str = WORKER_MODULE) -> None:
        self.env = env
        self.module = module
        self.log_dir = log_dir
        self.track = track
        self.workers: list[subprocess.Popen[bytes]] = []
        self.killed: dict[int, float] = {}  # pid -> when it was killed (or found dead)
        self.peak_rss = 0

    def start(self, count: int = 1, **env: str) -> None:
        """Start ``count`` workers, with ``env`` over the fleet's environment for these only."""
        for _ in range(count):
            name = f"{self.module.rsplit('.', 1)[-1]}-{len(self.workers)}.log"
            log = open(self.log_dir / name, "wb")  # noqa: SIM115 - the child's
            process = subprocess.Popen(
                [sys.executable, "-m", "agora_pg.cli", "worker", "--module", self.module],
                env={**self.env, **env}, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
            log.close()
            self.track(process)
            self.workers.append(process)

    @property
    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [worker for worker in self.workers if worker.poll() is None]

    def kill_random(self, rng: random.Random) -> int:
        victim = rng.choice(self.alive)
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(10)
        self.killed[victim.pid] = time.time()
        return victim.pid

    def replace_dead(self) -> int:
        """Start a worker for each one that exited on its own (a handler that killed it)."""
        dead = [w for w in self.workers if w.poll() is not None and w.pid not in self.killed]
        for worker in dead:
            self.killed[worker.pid] = time.time()
        self.start(len(dead))
        return len(dead)

    def sample_rss(self) -> None:
        total = 0
        for worker in self.alive:
            try:
                total = max(total, psutil.Process(worker.pid).memory_info().rss)
            except psutil.Error:
                pass
        self.peak_rss = max(self.peak_rss, total)

    def stop(self, timeout: float = 30.0) -> list[int | None]:
        """SIGTERM every live worker; their exit codes (None: did not stop in time, killed)."""
        for worker in self.alive:
            os.kill(worker.pid, signal.SIGTERM)
        codes: list[int | None] = []
        deadline = time.monotonic() + timeout
        for worker in self.workers:
            if worker.pid in self.killed:
                continue
            try:
                codes.append(worker.wait(max(0.1, deadline - time.monotonic())))
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(10)
                codes.append(None)
        return codes

    def logs(self) -> str:
        return "\n".join(f"--- {path.name}\n{path.read_text(errors='replace')[-3000:]}"
                         for path in sorted(self.log_dir.glob("worker-*.log")))


class Producer:
    """Enqueues ``work`` jobs at a steady rate, a batch every 0.1 s, until ``stop()``.
    While the database is away it keeps trying; ``acknowledged`` holds the ids of the
    jobs whose enqueue was answered."""

    def __init__(self, database_url: str, rate: float, job_seconds: float, kind: str = "work") -> None:
        self.database = Database(database_url)
        self.rate = rate
        self.job_seconds = job_seconds
        self.kind = kind
        self.acknowledged: list[int] = []
        self.failed_batches = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        store = Store.open(self.database, pool_size=1, timeout=3)
        try:
            started = time.monotonic()
            sent = 0
            while not self._stop.is_set():
                due = int((time.monotonic() - started) * self.rate) - sent
                if due > 0:
                    specs = [JobSpec(self.kind, {"seconds": self.job_seconds}) for _ in range(due)]
                    try:
                        jobs = await store.jobs.enqueue(specs)
                    except (DatabaseUnavailable, OSError):
                        self.failed_batches += 1
                        await asyncio.sleep(0.2)
                        continue
                    self.acknowledged += [job.id for job, _created in jobs]
                    sent += due
                await asyncio.sleep(0.1)
        finally:
            await store.close()


@dataclasses.dataclass(frozen=True)
class Execution:
    job_id: int
    attempt: int
    pid: int
    at: float  # time.time()


def read_ledger(ledger_dir: Path) -> list[Execution]:
    rows = []
    for path in ledger_dir.glob("*.ledger"):
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 4:  # (a line cut short by a kill has fewer)
                rows.append(Execution(int(parts[0]), int(parts[1]), int(parts[2]), float(parts[3])))
    return sorted(rows, key=lambda row: row.at)


def read_ends(ledger_dir: Path) -> dict[tuple[int, int, int], float]:
    """When each execution that recorded its end ended: (job, attempt, pid) -> time."""
    ends = {}
    for path in ledger_dir.glob("*.ends"):
        for line in path.read_text(encoding="utf-8").splitlines():
            parts = line.split()
            if len(parts) == 4:
                ends[(int(parts[0]), int(parts[1]), int(parts[2]))] = float(parts[3])
    return ends


def peak_running(executions: list[Execution], ends: dict[tuple[int, int, int], float],
                 killed: dict[int, float], key_of: dict[int, str]) -> dict[str, int]:
    """The most executions of each key (``key_of``: job id -> key) that ran at one
    instant, from the ledger: each from its start to its recorded end, or to its
    process's kill (an execution with neither runs to the end of time). At one instant,
    ends count before starts."""
    events: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for e in executions:
        if e.job_id not in key_of:
            continue
        end = ends.get((e.job_id, e.attempt, e.pid), killed.get(e.pid, float("inf")))
        events[key_of[e.job_id]] += [(e.at, 1), (end, -1)]
    peaks = {}
    for key, moments in events.items():
        running = peak = 0
        for _, step in sorted(moments, key=lambda m: (m[0], m[1])):
            running += step
            peak = max(peak, running)
        peaks[key] = peak
    return peaks


LEDGER_TABLE = """
CREATE TABLE IF NOT EXISTS public.chaos_ledger (job_id bigint NOT NULL, attempt int NOT NULL, pid int NOT NULL,
                                               at timestamptz NOT NULL)
"""


async def store_ledger(database_url: str, executions: list[Execution]) -> None:
    """The executions in ``public.chaos_ledger`` (no unique constraint: duplicates stay)."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(LEDGER_TABLE)
        await connection.execute("TRUNCATE public.chaos_ledger")
        await connection.executemany(
            "INSERT INTO public.chaos_ledger VALUES ($1, $2, $3, to_timestamp($4))",
            [(e.job_id, e.attempt, e.pid, e.at) for e in executions],
        )
    finally:
        await connection.close()


@dataclasses.dataclass(frozen=True)
class Tally:
    enqueued: int
    done: int
    failed: int
    lost: int  # done without ever being executed, or acknowledged and gone
    stuck: int  # pending or processing at the end
    duplicates: int  # jobs executed more than once
    explained: int  # ... each earlier execution cut short by a kill, or its attempt recorded as ended
                    # without success (abandoned: lease lost; failed; cancelled)
    unexplained: int
    unexplained_ids: tuple[int, ...] = ()


# A failed job waits for a retry while retry_count < max_retries; a final failure (retries
# or lost attempts used up) caps max_retries at retry_count.
# (the jobs of the flow: a pool's pipeline runs, in agora:pipelines, are the scenario's own checks)
WAITING = ("(j.queue <> 'agora:pipelines' AND (j.status IN ('pending', 'processing') "
           "OR j.status = 'failed' AND j.retry_count < COALESCE(j.max_retries, 3)))")

TALLY = f"""
WITH executions AS (
    SELECT job_id, count(*) AS n FROM public.chaos_ledger GROUP BY job_id
)
SELECT count(*) AS enqueued,
       count(*) FILTER (WHERE j.status = 'done') AS done,
       count(*) FILTER (WHERE j.status = 'failed' AND NOT {WAITING}) AS failed,
       count(*) FILTER (WHERE j.status = 'done' AND e.n IS NULL) AS done_unexecuted,
       count(*) FILTER (WHERE {WAITING}) AS stuck
FROM agora.jobs j LEFT JOIN executions e ON e.job_id = j.id
WHERE j.kind = $1
"""


async def tally(database_url: str, executions: list[Execution], killed: dict[int, float],
                acknowledged: list[int], kind: str = "work") -> Tally:
    """The jobs of ``kind`` against the ledger (see ``Tally``)."""
    await store_ledger(database_url, executions)
    connection = await asyncpg.connect(database_url)
    try:
        counts = await connection.fetchrow(TALLY, kind)
        present = {row["id"] for row in await connection.fetch("SELECT id FROM agora.jobs")}
        work = {row["id"] for row in await connection.fetch("SELECT id FROM agora.jobs WHERE kind = $1", kind)}
        # attempts that ended without success, recorded: a retry of them is by design
        ended = {(row["job_id"], row["attempt"]) for row in await connection.fetch(
            "SELECT job_id, attempt FROM agora.runs WHERE job_id IS NOT NULL AND status <> 'succeeded'")}
    finally:
        await connection.close()
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for execution in executions:
        if execution.job_id in work:
            by_job[execution.job_id].append(execution)
    duplicates = {job_id: runs for job_id, runs in by_job.items() if len(runs) > 1}
    unexplained = sorted(
        job_id for job_id, runs in duplicates.items()
        if not all(run.pid in killed or (run.job_id, run.attempt) in ended for run in runs[:-1])
    )
    missing = len(set(acknowledged) - present)
    return Tally(
        enqueued=counts["enqueued"], done=counts["done"], failed=counts["failed"],
        lost=counts["done_unexecuted"] + missing, stuck=counts["stuck"], duplicates=len(duplicates),
        explained=len(duplicates) - len(unexplained), unexplained=len(unexplained),
        unexplained_ids=tuple(unexplained[:10]),
    )


def rate(executions: list[Execution], start: float, end: float) -> float:
    """Executions per second in [start, end)."""
    if end <= start:
        return 0.0
    return sum(1 for e in executions if start <= e.at < end) / (end - start)


def recovery_seconds(executions: list[Execution], baseline: float, fault_end: float, until: float) -> float | None:
    """Seconds from the fault's end until a one-second window first reaches
    ``RECOVERY_SHARE`` of the baseline throughput (None: it never did)."""
    step = 0.1
    start = fault_end
    while start + 1.0 <= until:
        if rate(executions, start, start + 1.0) >= RECOVERY_SHARE * baseline:
            return round(start + 1.0 - fault_end, 1)
        start += step
    return None


async def waiting_jobs(database_url: str, ids: list[int] | None = None) -> int | None:
    """How many jobs (of ``ids``, if given) are pending, processing or waiting for a retry
    (None: no answer)."""
    try:
        connection = await asyncpg.connect(database_url, timeout=3)
        try:
            return int(await connection.fetchval(
                f"SELECT count(*) FROM agora.jobs AS j WHERE {WAITING} AND ($1::bigint[] IS NULL OR j.id = ANY($1))", ids))
        finally:
            await connection.close()
    except (OSError, asyncpg.PostgresError, TimeoutError):
        return None


async def wait_drained(database_url: str, timeout: float) -> bool:
    """Until no job is pending, processing or waiting for a retry (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await waiting_jobs(database_url) == 0:
            return True
        await asyncio.sleep(0.25)
    return False


def drain_bound(backlog: int, before: float) -> float:
    """How long the ``backlog`` left when the flow stops may take to drain: at half the
    throughput measured before the fault in the same run (a busy machine slows both),
    plus two leases (the jobs of a worker killed last wait for its lease) and 10 s for
    retries and a replaced worker's start."""
    return 2 * backlog / max(before, 1.0) + 2 * LEASE_SECONDS + 10.0


async def wake_up_latency(database_url: str, ledger_dir: Path, timeout: float = 10.0) -> float:
    """Seconds from one ``work`` job's enqueue to its execution, with the workers idle."""
    store = Store.open(Database(database_url), pool_size=1)
    try:
        [(job, _created)] = await store.jobs.enqueue([JobSpec("work", {"seconds": 0})])
        sent = time.time()
    finally:
        await store.close()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for execution in read_ledger(ledger_dir):
            if execution.job_id == job.id:
                return execution.at - sent
        await asyncio.sleep(0.005)
    return float("inf")


@dataclasses.dataclass
class Result:
    """What one scenario measured."""

    scenario: str
    size: str
    tally: Tally
    before: float = 0.0  # executions per second
    during: float = 0.0
    after: float = 0.0
    recovery: float | None = None  # seconds; None where the scenario has no throughput shape
    peak_rss_mb: float = 0.0
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    shape: bool = True  # baseline/fault/recovery: the recovery threshold applies
    extra_violations: list[str] = dataclasses.field(default_factory=list)  # the scenario's own checks

    def violations(self) -> list[str]:
        """The pass thresholds, written before the run: 0 lost, 0 stuck, duplicates only
        where explained, recovery to 90 % of the baseline within 10 s of the fault ending."""
        found = []
        t = self.tally
        if t.lost:
            found.append(f"{t.lost} lost")
        if t.stuck:
            found.append(f"{t.stuck} stuck")
        if t.unexplained:
            found.append(f"{t.unexplained} unexplained duplicates: {t.unexplained_ids}")
        if self.shape and (self.recovery is None or self.recovery > RECOVERY_LIMIT_SECONDS):
            found.append(f"recovery {self.recovery} s (limit {RECOVERY_LIMIT_SECONDS} s)")
        if self.notes.get("drained") is False:
            found.append("the jobs did not drain after the flow")
        return found + self.extra_violations


async def measure_flow(
    scenario: str, size: Size, database_url: str, fleet: Fleet, ledger_dir: Path,
    fault: Callable[[], Awaitable[dict[str, Any] | None]], *,
    after_drain: Callable[[], Awaitable[dict[str, Any]]] | None = None, supervise: bool = False,
) -> Result:
    """Steady flow through ``fleet``: baseline, ``fault()``, recovery; then drain (within
    ``drain_bound`` of the backlog and the throughput before the fault) and tally.
    With ``supervise``, workers that die are replaced until the drain ends, as a process
    supervisor would (noted as ``workers_replaced``)."""
    producer = Producer(database_url, size.rate, size.job_seconds)
    producer.start()
    sampling = True
    replaced = 0

    async def sample() -> None:
        nonlocal replaced
        while sampling:
            fleet.sample_rss()
            for _ in range(5):
                if supervise:
                    replaced += fleet.replace_dead()
                await asyncio.sleep(0.1)

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(size.baseline)
    fault_start = time.time()
    notes = await fault() or {}
    fault_end = time.time()
    await asyncio.sleep(size.recovery)
    flow_end = time.time()
    await producer.stop()
    before = rate(read_ledger(ledger_dir), fault_start - (size.baseline - 1.0), fault_start)
    backlog = await waiting_jobs(database_url)
    drain_started = time.monotonic()
    drained = await wait_drained(database_url, drain_bound(backlog or 0, before))
    notes["drain"] = f"{backlog} jobs in {time.monotonic() - drain_started:.1f} s"
    sampling = False
    await sampler
    if supervise:
        notes["workers_replaced"] = replaced
    if after_drain is not None:
        notes.update(await after_drain())
    codes = fleet.stop()
    executions = read_ledger(ledger_dir)
    counts = await tally(database_url, executions, fleet.killed, producer.acknowledged)
    notes.update(drained=drained, stop_codes=codes, enqueue_retries=producer.failed_batches)
    return Result(
        scenario, size.name, counts, before=round(before, 1),
        during=round(rate(executions, fault_start, fault_end), 1),
        after=round(rate(executions, fault_end, flow_end), 1),
        recovery=recovery_seconds(executions, before, fault_end, flow_end),
        peak_rss_mb=round(fleet.peak_rss / 2**20, 1), notes=notes,
    )


def table(results: list[Result]) -> str:
    """The report's Markdown table."""
    lines = [
        "| scenario | size | enqueued | done | failed | lost | stuck | duplicates (explained / unexplained) "
        "| jobs/s before / during / after | recovery s | peak worker RSS MB | notes |",
        "|---|---|---:|---:|---:|---:|---:|---|---|---:|---:|---|",
    ]
    for r in results:
        t = r.tally
        notes = "; ".join(f"{k}={v}" for k, v in r.notes.items() if k not in ("stop_codes",))
        recovery = "-" if not r.shape else ("never" if r.recovery is None else f"{r.recovery}")
        rates = (f"{r.before} / {r.during} / {r.after}" if r.shape
                 else f"- / - / {r.after} (the drain)" if r.after else "-")
        lines.append(
            f"| {r.scenario} | {r.size} | {t.enqueued} | {t.done} | {t.failed} | {t.lost} | {t.stuck} "
            f"| {t.duplicates} ({t.explained} / {t.unexplained}) | {rates} "
            f"| {recovery} | {r.peak_rss_mb} | {notes} |"
        )
    return "\n".join(lines)


def rerun_delays(executions: list[Execution], killed: dict[int, float]) -> list[float]:
    """For each job a killed worker was running: seconds from the kill to its next execution."""
    delays = []
    by_job: dict[int, list[Execution]] = defaultdict(list)
    for execution in executions:
        by_job[execution.job_id].append(execution)
    for runs in by_job.values():
        for earlier, later in zip(runs, runs[1:]):
            if earlier.pid in killed and later.at > killed[earlier.pid]:
                delays.append(later.at - killed[earlier.pid])
    return delays


async def wait_workers(database_url: str, count: int, timeout: float = 30.0) -> None:
    """Until ``count`` job workers have registered (and not stopped); a pool running
    pipelines has a row too, which does not count."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        connection = await asyncpg.connect(database_url)
        try:
            registered = await connection.fetchval(
                "SELECT count(*) FROM agora.workers WHERE stopped_at IS NULL AND NOT 'agora:pipelines' = ANY(queues)")
            if registered >= count:
                return
        finally:
            await connection.close()
        await asyncio.sleep(0.1)
    raise TimeoutError(f"{count} workers did not start within {timeout}s")
