"""Rate limits hold across worker processes, counted on the database's clock: one per key
of a kind, one of a queue (of every kind together)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections import defaultdict
from datetime import datetime, timezone
from pathlib import Path

import asyncpg
import pytest

from agora_pg import JobSpec, Queue
from benchmarks.rate_limit import most_in_any_window

from ..conftest import Processes
from .test_worker_processes import HERE, worker_env

RATE, WINDOW, KEYS, SECONDS = 5, 1.0, 2, 6.0  # (rated_app's limits: 5 a second)
# A handler starts a little after its claim stamped its start (the claim's reply, the
# event loop): the most this test allows. Starts that keep the rate in every WINDOW of
# their stamps keep it in every WINDOW - HANDLER_LAG of handler time.
HANDLER_LAG = 0.25


async def _starts_of_three_workers(
    database_url: str, processes: Processes, starts_dir: Path
) -> tuple[list[asyncpg.Record], datetime, int]:
    """Run three worker processes of ``rated_app`` until the first start is SECONDS old;
    the started jobs' id, queue, key and started_at, the first start, and how many waiting
    jobs were charged an attempt. The handlers' own starts are left in ``starts_dir``."""
    command = [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "rated_app", "--queues", "default,paced"]
    for _ in range(3):
        processes.start(command, worker_env(database_url, RATED_STARTS_DIR=str(starts_dir)), HERE)
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
            "SELECT id, queue, payload->>'key' AS key, started_at FROM agora.jobs WHERE started_at IS NOT NULL")
        first = min(row["started_at"] for row in rows)
        charged = await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE status = 'pending' AND (attempt > 0 OR retry_count > 0)")
    finally:
        await connection.close()
    return rows, first, charged


def _handler_starts(starts_dir: Path, ids: set[int]) -> list[datetime]:
    """When the handlers of jobs ``ids`` started, as they recorded it."""
    moments = []
    for path in starts_dir.iterdir():
        for line in path.read_text(encoding="utf-8").splitlines():
            job_id, moment = line.split()
            if int(job_id) in ids:
                moments.append(datetime.fromtimestamp(float(moment), timezone.utc))
    return moments


def _holds_and_is_reached(starts: list[datetime], first: datetime, what: str,
                          handler_starts: list[datetime]) -> None:
    assert most_in_any_window(starts, WINDOW) <= RATE, (what, sorted(starts))
    assert most_in_any_window(handler_starts, WINDOW - HANDLER_LAG) <= RATE, (what, sorted(handler_starts))
    # and the limit is reached, not merely respected: about RATE a window over the run
    in_run = [s for s in starts if (s - first).total_seconds() < SECONDS]
    assert len(in_run) >= RATE * (SECONDS / WINDOW) - RATE - 1, (what, len(in_run))


@pytest.mark.connections(28)
async def test_a_rate_limit_per_key_holds_across_three_processes(
    queue: Queue, database_url: str, processes: Processes, tmp_path: Path
) -> None:
    await queue.enqueue_many([JobSpec("rated", {"key": f"k{i % KEYS}"}) for i in range(200)])
    rows, first, charged = await _starts_of_three_workers(database_url, processes, tmp_path)
    by_key: dict[str, list[asyncpg.Record]] = defaultdict(list)
    for row in rows:
        by_key[row["key"]].append(row)
    assert set(by_key) == {f"k{i}" for i in range(KEYS)}
    for key, started in by_key.items():
        _holds_and_is_reached([row["started_at"] for row in started], first, key,
                              _handler_starts(tmp_path, {row["id"] for row in started}))
    assert charged == 0  # a job held back by the limit is charged nothing


@pytest.mark.connections(28)
async def test_a_queue_rate_limit_holds_across_three_processes(
    queue: Queue, database_url: str, processes: Processes, tmp_path: Path
) -> None:
    # two kinds without limits of their own, in the queue limited to 5 starts a second
    await queue.enqueue_many([JobSpec("plain" if i % 2 else "other", queue="paced") for i in range(200)])
    rows, first, charged = await _starts_of_three_workers(database_url, processes, tmp_path)
    assert {row["queue"] for row in rows} == {"paced"}
    _holds_and_is_reached([row["started_at"] for row in rows], first, "paced",
                          _handler_starts(tmp_path, {row["id"] for row in rows}))
    assert charged == 0
