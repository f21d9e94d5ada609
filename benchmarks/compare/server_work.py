"""The server's work per job during a drain, for any system (issue 16, item 2).

One worker process drains ``jobs`` pre-enqueued no-op jobs; the counters below are
read after the enqueue (and a ``CHECKPOINT``, so that every system starts with the
same full-page-write state) and again after the worker stopped, and divided by the
number of jobs:

- server CPU: user + system time of the postmaster and all its processes (backends,
  WAL writer, checkpointer, autovacuum), from ``/proc`` through ``psutil``, including
  the processes that exited meanwhile (their time is in the postmaster's children
  times). The server must run on this host, and this user must be able to read its
  ``postmaster.pid``;
- the worker's CPU (the process and its children) and its peak resident memory
  (sampled every 50 ms);
- WAL: bytes, records and full-page images (``pg_stat_wal``, cluster-wide: nothing
  else may run);
- commits and rows written (inserted + updated + deleted) in the drained database
  (``pg_stat_database``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from agora_pg.db.connect import Database
from benchmarks.compare.processes import fresh_database, workers
from benchmarks.compare.systems.base import System
from benchmarks.compare.workloads import analyze_after_loading

DRAIN_TIMEOUT = 900.0
STATS_FLUSH_SECONDS = 1.2  # backends flush their statistics at most once a second
# How often the harness counts the done jobs (a count over the whole table: its own
# server CPU, about 1 % of the measured figure at this interval).
POLL_SECONDS = 1.0
RSS_SAMPLE_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class Counters:
    server_cpu: float | None  # seconds; None when the postmaster cannot be read
    wal_bytes: float
    wal_records: int
    wal_fpi: int
    commits: int
    rows_written: int

    def __sub__(self, other: Counters) -> Counters:
        cpu = None if self.server_cpu is None or other.server_cpu is None else self.server_cpu - other.server_cpu
        return Counters(cpu, self.wal_bytes - other.wal_bytes, self.wal_records - other.wal_records,
                        self.wal_fpi - other.wal_fpi, self.commits - other.commits,
                        self.rows_written - other.rows_written)


def postmaster(data_directory: str) -> psutil.Process | None:
    """The server's postmaster, from its ``postmaster.pid`` (None if unreadable)."""
    try:
        pid = int(Path(data_directory, "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def tree_cpu_seconds(process: psutil.Process) -> float:
    """CPU seconds of a process, its exited (waited-for) children and its live descendants."""
    times = process.cpu_times()
    total = times.user + times.system + times.children_user + times.children_system
    for child in process.children(recursive=True):
        try:
            child_times = child.cpu_times()
        except psutil.NoSuchProcess:  # (it exited since: its time is now in its parent's children times)
            continue
        total += child_times.user + child_times.system
    return total


def tree_rss(process: psutil.Process) -> int:
    """Resident bytes of a process and its live descendants (0 once it is gone)."""
    try:
        members = [process, *process.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    total = 0
    for member in members:
        try:
            total += member.memory_info().rss
        except psutil.NoSuchProcess:
            continue
    return total


async def read_counters(connection: asyncpg.Connection, server: psutil.Process | None) -> Counters:
    row = await connection.fetchrow(
        """
        SELECT w.wal_bytes, w.wal_records, w.wal_fpi, d.xact_commit,
               d.tup_inserted + d.tup_updated + d.tup_deleted AS rows_written
        FROM pg_stat_wal AS w, pg_stat_database AS d WHERE d.datname = current_database()
        """
    )
    return Counters(tree_cpu_seconds(server) if server is not None else None, float(row["wal_bytes"]),
                    int(row["wal_records"]), int(row["wal_fpi"]), int(row["xact_commit"]), int(row["rows_written"]))


async def server_work_per_job(server: Database, system: System, jobs: int) -> dict[str, Any]:
    """Per-job server CPU (us), worker CPU (us) and the worker's peak RSS, WAL bytes, WAL records, full-page images,
    commits and rows written, and the drain rate, for one process draining ``jobs``."""
    async with fresh_database(server, system, "work") as url:
        await system.enqueue_batch(url, jobs)
        await analyze_after_loading(url)
        connection = await asyncpg.connect(Database(url).asyncpg_url)
        try:
            postmaster_process = postmaster(await connection.fetchval("SHOW data_directory"))
            await connection.execute("CHECKPOINT")
            await asyncio.sleep(STATS_FLUSH_SECONDS)
            before = await read_counters(connection, postmaster_process)
            with workers(system, url, "drain", 1) as started:
                worker = psutil.Process(started[0].pid)
                deadline = time.monotonic() + DRAIN_TIMEOUT
                peak_rss = tree_rss(worker)
                next_count = 0.0
                while time.monotonic() < next_count or await system.done_count(url) < jobs:
                    if time.monotonic() >= next_count:
                        next_count = time.monotonic() + POLL_SECONDS
                    if started[0].poll() is not None:
                        raise RuntimeError(f"{system.name}: the worker exited early")
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{system.name}: drain of {jobs} did not finish in {DRAIN_TIMEOUT:.0f}s")
                    await asyncio.sleep(RSS_SAMPLE_SECONDS)
                    peak_rss = max(peak_rss, tree_rss(worker))
                worker_cpu = tree_cpu_seconds(worker)
            await asyncio.sleep(STATS_FLUSH_SECONDS)
            spent = await read_counters(connection, postmaster_process) - before
        finally:
            await connection.close()
        rate = jobs / await system.completion_span_seconds(url)
    return {
        "jobs": jobs,
        "drain_per_s": rate,
        "server_cpu_us": None if spent.server_cpu is None else spent.server_cpu / jobs * 1e6,
        "worker_cpu_us": worker_cpu / jobs * 1e6,
        "worker_peak_rss_mb": peak_rss / 2**20,
        "wal_bytes": spent.wal_bytes / jobs,
        "wal_records": spent.wal_records / jobs,
        "wal_fpi": spent.wal_fpi / jobs,
        "commits": spent.commits / jobs,
        "rows_written": spent.rows_written / jobs,
    }
