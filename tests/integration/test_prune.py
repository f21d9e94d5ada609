"""Pruning finished history: what goes, what stays, one process at a time, the CLI and
the worker's own rounds, on a real database."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path
from typing import Any

import asyncpg

from agora_pg import Job, Settings, Worker
from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.job_spec import JobSpec
from agora_pg.retention import Retention, parse_age

from .helpers import running, wait_until

REPO = Path(__file__).resolve().parents[2]
DAYS = parse_age("1d", "test")


async def _history(store: Store) -> dict[str, int]:
    """Jobs in every end state at several ages, their runs, pipeline runs and dead letters;
    names say what must happen to each (``gone_*`` or ``kept_*``)."""
    shapes = {  # name: (status, retry_count, max_retries, days since it finished)
        "gone_done": ("done", 0, 3, 40), "kept_done_recent": ("done", 0, 3, 5),
        "gone_cancelled": ("cancelled", 0, 3, 40), "kept_failed_40d": ("failed", 3, 3, 40),
        "gone_failed_100d": ("failed", 3, 3, 100), "kept_failed_retrying": ("failed", 1, 3, 100),
        "kept_pending": ("pending", 0, 3, 100), "kept_processing": ("processing", 0, 3, 100),
    }
    ids: dict[str, int] = {}
    for name, (status, retries, max_retries, days) in shapes.items():
        [(job, _created)] = await store.jobs.enqueue([JobSpec("k", {"name": name}, max_retries=max_retries)])
        ids[name] = job.id
        async with store.connection() as connection:
            await connection.execute(
                "UPDATE agora.jobs SET status = $2, retry_count = $3, finished_at = now() - $4::interval, "
                "started_at = now() - $4::interval, locked_by = CASE WHEN $2 = 'processing' THEN 'w1' END "
                "WHERE id = $1", job.id, status, retries, days * DAYS)
            await connection.execute(
                "INSERT INTO agora.runs (job_id, attempt, status, started_at, finished_at) "
                "VALUES ($1, 1, 'succeeded', now() - $2::interval, now() - $2::interval)", job.id, days * DAYS)
    async with store.connection() as connection:
        for days in (40, 5):
            await connection.execute(
                "INSERT INTO agora.runs (pipeline_id, attempt, status, started_at, finished_at) "
                "VALUES ('nightly', 1, 'succeeded', now() - $1::interval, now() - $1::interval)", days * DAYS)
        await connection.execute("INSERT INTO agora.runs (pipeline_id, attempt, status) VALUES ('nightly', 1, 'running')")
        for replayed in (40, 5, None):
            await connection.execute(
                "INSERT INTO agora.dead_letters (pipeline_id, stage, record, error_type, error_message, replayed_at) "
                "VALUES ('nightly', 'map', '{}', 'ValueError', 'bad', now() - $1::interval)",
                None if replayed is None else replayed * DAYS)
    return ids


async def _left(store: Store) -> tuple[set[str], int, int, int]:
    async with store.connection() as connection:
        names = {row["name"] for row in await connection.fetch("SELECT payload->>'name' AS name FROM agora.jobs")}
        job_runs = await connection.fetchval("SELECT count(*) FROM agora.runs WHERE job_id IS NOT NULL")
        pipeline_runs = await connection.fetchval("SELECT count(*) FROM agora.runs WHERE job_id IS NULL")
        letters = await connection.fetchval("SELECT count(*) FROM agora.dead_letters")
    return names, job_runs, pipeline_runs, letters


async def test_prune_deletes_old_finished_history_and_nothing_alive(store: Store) -> None:
    ids = await _history(store)
    report = await store.prune(Retention(30 * DAYS, 90 * DAYS), batch_size=2)
    assert (report.jobs, report.pipeline_runs, report.dead_letters, report.busy) == (3, 1, 1, False)
    names, job_runs, pipeline_runs, letters = await _left(store)
    assert names == {name for name in ids if name.startswith("kept_")}
    assert job_runs == 5 and pipeline_runs == 2 and letters == 2  # runs went with their jobs
    again = await store.prune(Retention(30 * DAYS, 90 * DAYS))
    assert (again.jobs, again.pipeline_runs, again.dead_letters) == (0, 0, 0)


async def test_only_one_process_prunes_at_a_time(store: Store, database_url: str) -> None:
    await _history(store)
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            assert await holder.fetchval(queries.TRY_PRUNE_LOCK, queries.PRUNE_LOCK_KEY)
            report = await store.prune(Retention(30 * DAYS, 90 * DAYS))
    finally:
        await holder.close()
    assert report.busy and (report.jobs, report.pipeline_runs, report.dead_letters) == (0, 0, 0)
    assert len((await _left(store))[0]) == 8


async def test_the_prune_command(store: Store, database_url: str) -> None:
    await _history(store)
    env = {"AGORA_PG_DATABASE_URL": database_url, "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-m", "agora_pg.cli", "prune", "--older-than", "30d", "--keep-failed", "90d"],
                          env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "pruned 3 jobs with their runs, 1 pipeline runs, 1 dead letters"
    for args, message in ((["--older-than", "soon"], "agora-pg: --older-than: expected an age such as 30d"),
                          (["--older-than", "90d", "--keep-failed", "30d"], "agora-pg: --keep-failed: failed jobs")):
        refused = subprocess.run([sys.executable, "-m", "agora_pg.cli", "prune", *args], env=env, cwd=REPO,
                                 capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and refused.stderr.strip().startswith(message), refused.stderr
    assert len((await _left(store))[0]) == 5


async def test_a_worker_prunes_on_its_own(store: Store, settings: Settings) -> None:
    ids = await _history(store)

    async def noop(job: Job, resources: Any) -> None:
        return None

    pruning = settings.replace(retention=Retention(30 * DAYS, 90 * DAYS), prune_interval=0.2, queues=("elsewhere",))
    async with running(Worker({"k": noop}, settings=pruning)):
        await wait_until(lambda: _gone(store, ids["gone_done"]))
        await asyncio.sleep(0.5)  # a few more rounds: they find nothing more
    names, _job_runs, _pipeline_runs, _letters = await _left(store)
    assert names == {name for name in ids if name.startswith("kept_")}


async def _gone(store: Store, job_id: int) -> bool:
    async with store.connection() as connection:
        return await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE id = $1", job_id) == 0
