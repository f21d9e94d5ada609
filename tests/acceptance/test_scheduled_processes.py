"""Scheduled pipelines in real `agora-pg worker` processes: sharing, kill -9, restarts, signals, health."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from ..conftest import Processes
from ..faults import outside_address
from .pipeline_app import CREATE_EVENTS
from .test_worker_processes import eventually, free_port, output_until, scalar, stop, worker_env

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.acceptance


def start_pool(processes: Processes, url: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "pipeline_app", *args]
    return processes.start(command, worker_env(url, **env), HERE)


@pytest.fixture
async def events(database_url: str) -> None:
    await scalar(database_url, CREATE_EVENTS)


async def fetch(url: str, sql: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetch(sql, *args)
    finally:
        await connection.close()


async def run_statuses(url: str) -> list[str]:
    return [row["status"] for row in await fetch(url, "SELECT status FROM agora.runs WHERE pipeline_id = 'acceptance' ORDER BY id")]


def http_get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.mark.connections(34)
async def test_three_workers_share_one_pipeline_without_overlap(
    database_url: str, processes: Processes, events: None
) -> None:
    workers = [start_pool(processes, database_url, PIPELINE_SLEEP="0.3") for _ in range(3)]

    async def ran(count: int) -> bool:
        return len(await run_statuses(database_url)) >= count

    await eventually(lambda: ran(6), 120, "six runs of the shared pipeline")
    for process in workers:
        code, output = stop(process)
        assert code == 0, output
    rows = await fetch(database_url, "SELECT started_at, finished_at, pid FROM public.pipeline_events ORDER BY started_at")
    runs = await fetch(
        database_url,
        "SELECT status, started_at, finished_at FROM agora.runs WHERE pipeline_id = 'acceptance' ORDER BY started_at",
    )
    assert all(row["finished_at"] is not None for row in rows)
    assert [run["status"] for run in runs] == ["succeeded"] * len(runs)
    assert len(rows) == len(runs)
    gaps = [(later["started_at"] - earlier["finished_at"]).total_seconds() for earlier, later in zip(rows, rows[1:])]
    # never overlapping, and every(seconds=1) after each finish (a lower bound: load only adds to it)
    assert min(gaps) > 0.9, gaps
    # and no tick lost between workers: each run is the tick its predecessor's finish set,
    # one second after it (by the database's clock: no speed of the machine is assumed)
    ticks = await fetch(database_url, "SELECT scheduled_for, finished_at FROM agora.runs "
                                      "WHERE pipeline_id = 'acceptance' ORDER BY scheduled_for")
    chained = [(later["scheduled_for"] - earlier["finished_at"]).total_seconds() for earlier, later in zip(ticks, ticks[1:])]
    assert all(0.99 <= chain <= 1.01 for chain in chained), chained
    assert len(rows) >= 6


async def test_a_killed_worker_is_replaced_after_the_lease_expires(
    database_url: str, processes: Processes, events: None
) -> None:
    # (the same backoff in both: a replacement that rescues the run before it registers its
    # schedule applies the backoff the row holds)
    doomed = start_pool(processes, database_url, PIPELINE_SCHEDULE="hourly", PIPELINE_SLEEP="3600",
                        PIPELINE_BACKOFF="0.5", WORKER_LEASE_SECONDS="4")
    await eventually(lambda: _run_in_flight(database_url), 30, "the first run starting")
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    killed_at = time.monotonic()
    replacement = start_pool(processes, database_url, PIPELINE_SCHEDULE="hourly", PIPELINE_SLEEP="0",
                             PIPELINE_BACKOFF="0.5", WORKER_LEASE_SECONDS="4")
    try:
        await eventually(lambda: _statuses_are(database_url, ["abandoned", "succeeded"]), 30, "the replacement run")
    except AssertionError:
        print(stop(replacement)[1])
        raise
    # not before the 4 s lease ran out (renewed at most 1.3 s before the kill): a lower
    # bound, which a busy machine only makes easier to meet
    assert time.monotonic() - killed_at >= 2.5
    [abandoned] = await fetch(database_url, "SELECT error_type FROM agora.runs WHERE status = 'abandoned'")
    assert abandoned["error_type"] == "WorkerLost"  # counted as a failed run (backoff), then reset by the success
    code, output = stop(replacement)
    assert code == 0, output


async def _statuses_are(url: str, expected: list[str]) -> bool:
    return await run_statuses(url) == expected


async def _run_in_flight(url: str) -> bool:
    """A run of the pipeline is in flight: its job is running (its run row is written at its end)."""
    rows = await fetch(url, "SELECT 1 FROM agora.jobs WHERE dedup_key = 'pipeline:acceptance' AND status = 'processing'")
    return await run_statuses(url) == [] and len(rows) == 1


async def test_a_restarted_worker_keeps_the_error_counter_and_next_run(
    database_url: str, processes: Processes, events: None
) -> None:
    port = free_port()
    first = start_pool(processes, database_url, "--health-port", str(port), PIPELINE_FAIL="1", PIPELINE_BACKOFF="60")
    await eventually(lambda: _statuses_are(database_url, ["failed"]), 30, "the first failure")

    async def ready_counts_one_error() -> bool:  # (the pool reads its schedules' rows at its next pass)
        status, body = await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/ready")
        return status == 200 and body["pipelines"]["acceptance"]["consecutive_errors"] == 1

    await eventually(ready_counts_one_error, 30, "/ready answering 200 with consecutive_errors 1")
    code, output = stop(first)
    assert code == 0, output
    before = (await fetch(database_url, "SELECT consecutive_errors, next_run_at FROM agora.schedules"))[0]

    second = start_pool(processes, database_url, PIPELINE_FAIL="1", PIPELINE_BACKOFF="60")
    await output_until(second, "pipeline acceptance registered")
    await asyncio.sleep(1.0)  # time for a run, were the backoff forgotten
    code, output = stop(second)
    assert code == 0, output
    after = (await fetch(database_url, "SELECT consecutive_errors, next_run_at FROM agora.schedules"))[0]
    assert tuple(after) == tuple(before) and before["consecutive_errors"] == 1
    assert await run_statuses(database_url) == ["failed"]  # the backoff was respected across the restart


async def test_the_health_server_reports_error_types_on_loopback_and_metrics(
    database_url: str, processes: Processes, events: None
) -> None:
    """By default the health server listens on loopback only, refuses a Host that is not
    this machine, reports a pipeline's error type (not its text, which may hold a URL
    with a password) and serves /metrics; WORKER_HEALTH_ERROR_DETAILS=on adds the text,
    --health-host 0.0.0.0 opens it to other machines."""
    import httpx

    port = free_port()
    pool = start_pool(processes, database_url, "--health-port", str(port), PIPELINE_FAIL="1", PIPELINE_BACKOFF="60")
    await eventually(lambda: _statuses_are(database_url, ["failed"]), 30, "the first failure")
    # (the report reads the schedule row, which the run's end writes: wait for it, not for a moment)
    await eventually(lambda: _reports_an_error(f"http://127.0.0.1:{port}/health", "last_error_type"), 30,
                     "the failure in the health report")
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=5) as client:
        report = (await client.get("/health")).json()["pipelines"]["acceptance"]
        assert report["last_error_type"] == "RuntimeError" and "last_error" not in report, report
        metrics = await client.get("/metrics")
        assert metrics.status_code == 200 and "agora_schedules{" in metrics.text, metrics.text[:300]
        rebound = await client.get("/health", headers={"Host": "evil.example"})
        assert rebound.status_code == 403
        assert (await client.post("/health")).status_code == 405
        assert (await client.get("/nothing")).status_code == 404
    outside = outside_address()
    if outside is not None:
        with pytest.raises(httpx.ConnectError):
            await httpx.AsyncClient(timeout=3).get(f"http://{outside}:{port}/health")
    code, output = stop(pool)
    assert code == 0, output

    pool = start_pool(processes, database_url, "--health-port", str(port), "--health-host", "0.0.0.0",
                      PIPELINE_FAIL="1", PIPELINE_BACKOFF="60", WORKER_HEALTH_ERROR_DETAILS="on")
    health = f"http://{outside or '127.0.0.1'}:{port}/health"
    await eventually(lambda: _reports_an_error(health), 30, "the restarted pool's failure in its report")
    async with httpx.AsyncClient(timeout=5) as client:
        report = (await client.get(health)).json()["pipelines"]["acceptance"]
    assert report["last_error"].startswith("RuntimeError: source unavailable"), report
    code, output = stop(pool)
    assert code == 0, output


async def _reports_an_error(url: str, field: str = "last_error") -> bool:
    """The health report at ``url`` holds the pipeline's last error (``field``: its text,
    shown with error details, or its type)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=2) as client:
            report = (await client.get(url)).json()
    except (httpx.HTTPError, ValueError):
        return False
    return bool(report.get("pipelines", {}).get("acceptance", {}).get(field))


async def test_once_runs_at_each_launch_and_once_ever_with_a_key(
    database_url: str, processes: Processes, events: None
) -> None:
    for launch in (1, 2):  # as cron or Airflow would launch it, day after day
        worker = start_pool(processes, database_url, PIPELINE_SCHEDULE="once")
        await eventually(lambda: _statuses_are(database_url, ["succeeded"] * launch), 30, f"launch {launch}")
        stop(worker)
    await fetch(database_url, "DELETE FROM agora.runs")
    first = start_pool(processes, database_url, PIPELINE_SCHEDULE="once_key")
    await eventually(lambda: _statuses_are(database_url, ["succeeded"]), 30, "the keyed run")
    stop(first)
    second = start_pool(processes, database_url, PIPELINE_SCHEDULE="once_key")
    await output_until(second, "has completed its once schedule")
    code, output = stop(second)
    assert code == 0, output
    assert await run_statuses(database_url) == ["succeeded"]  # the key had run: not again
    assert await scalar(database_url, "SELECT state FROM agora.schedules") == "completed"


async def test_sigterm_mid_run_lets_the_run_finish_and_records_it(
    database_url: str, processes: Processes, events: None
) -> None:
    worker = start_pool(processes, database_url, PIPELINE_SCHEDULE="hourly", PIPELINE_SLEEP="2")
    await eventually(lambda: _run_in_flight(database_url), 30, "the run starting")
    code, output = stop(worker)
    assert code == 0, output
    assert await run_statuses(database_url) == ["succeeded"]
    assert await scalar(database_url, "SELECT finished_at IS NOT NULL FROM public.pipeline_events")


async def test_sigterm_past_the_grace_period_cancels_and_releases_the_run(
    database_url: str, processes: Processes, events: None
) -> None:
    worker = start_pool(processes, database_url, PIPELINE_SCHEDULE="hourly", PIPELINE_SLEEP="600", POOL_GRACE="0.5")
    await eventually(lambda: _run_in_flight(database_url), 30, "the run starting")
    code, output = stop(worker, timeout=20)
    assert code == 0, output
    assert await run_statuses(database_url) == ["cancelled"]
    assert await scalar(database_url, "SELECT next_run_at <= now() FROM agora.schedules")  # due again at once
    assert await scalar(database_url, "SELECT count(*) FROM agora.jobs WHERE status IN ('pending', 'processing')") == 0


async def test_max_consecutive_errors_ends_the_process_non_zero_and_a_restart_says_how_to_resume(
    database_url: str, processes: Processes, events: None
) -> None:
    env = dict(PIPELINE_FAIL="1", PIPELINE_BACKOFF="0.05", PIPELINE_MAX_ERRORS="3")
    failing = start_pool(processes, database_url, **env)
    output, _ = failing.communicate(timeout=60)
    assert failing.returncode == 1
    last_line = output.decode().strip().splitlines()[-1]
    assert "pipeline 'acceptance' stopped after 3 consecutive errors: RuntimeError: source unavailable" in last_line
    assert await run_statuses(database_url) == ["failed"] * 3

    restarted = start_pool(processes, database_url, **env)
    output, _ = restarted.communicate(timeout=60)
    assert restarted.returncode == 1
    last_line = output.decode().strip().splitlines()[-1]
    assert last_line.startswith("agora-pg: pipeline acceptance: its schedule is stopped after 3 failed runs in a row "
                                "(last error: RuntimeError: source unavailable); resume it with "
                                "`agora-pg schedules resume acceptance`"), last_line
    assert await run_statuses(database_url) == ["failed"] * 3  # nothing ran

    resumed = subprocess.run([sys.executable, "-m", "agora_pg.cli", "schedules", "resume", "acceptance"],
                             env=worker_env(database_url), cwd=HERE, capture_output=True, timeout=60)
    assert resumed.returncode == 0, resumed.stderr
    assert "acceptance" in resumed.stdout.decode() and "active" in resumed.stdout.decode()
    listed = subprocess.run([sys.executable, "-m", "agora_pg.cli", "schedules", "resume", "nope"],
                            env=worker_env(database_url), cwd=HERE, capture_output=True, timeout=60)
    assert listed.returncode == 1 and listed.stderr.decode().strip() == "agora-pg: schedule 'nope' does not exist"


async def test_a_second_sigint_cancels_at_once(database_url: str, processes: Processes, events: None) -> None:
    worker = start_pool(processes, database_url, PIPELINE_SCHEDULE="hourly", PIPELINE_SLEEP="600", POOL_GRACE="120")
    await eventually(lambda: _run_in_flight(database_url), 30, "the run starting")
    os.kill(worker.pid, signal.SIGINT)
    await asyncio.sleep(0.5)
    assert worker.poll() is None  # the first Ctrl+C waits for the run
    os.kill(worker.pid, signal.SIGINT)
    output, _ = worker.communicate(timeout=60)  # (well inside the 120 s grace the first one started)
    assert worker.returncode == 0, output.decode()
    assert await run_statuses(database_url) == ["cancelled"]
