"""The comparison harness runs end to end (tiny sizes, our system only; no timing asserted)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import CREATE_LATENCY_TABLE, latency_payload, record_latency

from ..conftest import Server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.acceptance


@pytest.mark.one_lane
def test_compare_harness_produces_a_table_for_agora(pg_server: Server, tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AGORA_PG_", "WORKER_"))}
    command = [
        sys.executable, "-m", "benchmarks.compare", "--database-url", pg_server.url("postgres"),
        "--systems", "agora", "--skip", "schedules,raw", "--jobs", "300", "--enqueue-jobs", "50", "--history", "1000",
        "--work-jobs", "300", "--processes", "1", "--latency-jobs", "5", "--out", str(tmp_path), "--no-chart",
    ]
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    [folder] = list(tmp_path.iterdir())
    results = json.loads((folder / "results.json").read_text())
    assert results["errors"] == []
    agora = results["systems"]["agora"]
    for metric in ("enqueue_one_per_s", "plain_insert_per_s", "enqueue_batch_per_s", "drain_1p", "wakeup_p50", "wakeup_p99",
                   "drain_empty_1p_median", "drain_grown_1p"):
        assert isinstance(agora[metric], float) and agora[metric] > 0, metric
    table = (folder / "results.md").read_text()
    assert "| 2. drain 300 jobs, 1 process(es) | jobs/s |" in table
    paired = (f"{agora['plain_insert_per_s']:,.0f} (asyncpg insert one into a plain table with agora.jobs' columns, "
              "around agora-pg's run)")
    assert f"| 1. enqueue, one call per job, against a Python client | jobs/s | {agora['enqueue_one_per_s']:,.0f} |" in table
    assert paired in table
    ratio = agora["enqueue_one_per_s"] / agora["plain_insert_per_s"]
    assert f"| enqueue one at a time vs a bare asyncpg insert, same columns | {ratio:.2f}x | ≥ 0.90x |" in table
    low, high = agora["work_low_concurrency"]["server_cpu_us"], agora["work"]["server_cpu_us"]
    assert f"| server CPU per job, concurrency 10 vs 500 | {low / high:.2f}x | ≤ 2.00x |" in table
    assert "| agora-pg, --concurrency 10 | 300 |" in table
    assert "| 5. drain, 1 process, 1,000 finished jobs in history (median of 3) | jobs/s |" in table


async def test_latency_handlers_running_at_once_each_record_their_latency(fresh_db: str) -> None:
    # The latency handlers of every compared worker share one recording connection; two
    # running at once must both record (asyncpg refuses a second operation in progress).
    connection = await asyncpg.connect(Database(fresh_db).asyncpg_url)
    try:
        await connection.execute(CREATE_LATENCY_TABLE)
        await asyncio.gather(*(record_latency(connection, latency_payload()) for _ in range(20)))
        assert await connection.fetchval("SELECT count(*) FROM public.bench_latency") == 20
    finally:
        await connection.close()
