"""A rate limit per key holds across worker processes, counted on the database's clock."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from datetime import datetime

import asyncpg

from agora_pg import JobSpec, Queue
from benchmarks.rate_limit import most_in_any_window

from ..conftest import Processes
from .test_worker_processes import HERE, worker_env

RATE, WINDOW, KEYS, SECONDS = 5, 1.0, 2, 6.0


async def test_a_rate_limit_per_key_holds_across_three_processes(
    queue: Queue, database_url: str, processes: Processes
) -> None:
    await queue.enqueue_many([JobSpec("rated", {"key": f"k{i % KEYS}"}) for i in range(200)])
    command = [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "rated_app"]
    for _ in range(3):
        processes.start(command, worker_env(database_url), HERE)
    started = time.monotonic()
    connection = await asyncpg.connect(database_url)
    try:
        while time.monotonic() - started < 60:
            first = await connection.fetchval("SELECT min(started_at) FROM agora.jobs WHERE started_at IS NOT NULL")
            if first is not None and await connection.fetchval(
                    "SELECT now() - $1::timestamptz > make_interval(secs => $2)", first, SECONDS):
                break
            await asyncio.sleep(0.2)
        rows = await connection.fetch(
            "SELECT payload->>'key' AS key, started_at, attempt, status FROM agora.jobs WHERE started_at IS NOT NULL")
        first = min(row["started_at"] for row in rows)
        pending_attempts = await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE status = 'pending' AND (attempt > 0 OR retry_count > 0)")
    finally:
        await connection.close()
    by_key: dict[str, list[datetime]] = defaultdict(list)
    for row in rows:
        by_key[row["key"]].append(row["started_at"])
    assert set(by_key) == {f"k{i}" for i in range(KEYS)}
    for key, starts in by_key.items():
        assert most_in_any_window(starts, WINDOW) <= RATE, (key, sorted(starts))
        # and the limit is reached, not merely respected: about RATE a window over the run
        in_run = [s for s in starts if (s - first).total_seconds() < SECONDS]
        assert len(in_run) >= RATE * (SECONDS / WINDOW) - RATE - 1, (key, len(in_run))
    assert pending_attempts == 0  # a job held back by the limit is charged nothing
