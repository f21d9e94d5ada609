"""Schemathesis against the served OpenAPI schema, with every check (server errors, status
codes and bodies the document does not list, schema-valid requests refused, schema-
violating ones accepted, the Allow header...) over every phase (examples, coverage,
fuzzing, stateful), once with the token and once without: zero failures."""

from __future__ import annotations

import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from agora_pg.db.connect import Database
from agora_pg.db.schedule_rows import ScheduleRegistration
from agora_pg.db.store import Store

from ..conftest import Processes
from .test_api_processes import REPO, cli, wait_ready
from .test_worker_processes import free_port, stop, worker_env

EXAMPLES_PER_OPERATION = 50  # (about 1,200 cases a run: every phase, every check)


async def _a_schedule(database_url: str) -> None:
    store = Store.open(Database(database_url), pool_size=1)
    try:
        await store.schedules.upsert(ScheduleRegistration(
            pipeline_id="nightly", kind="cron", spec="cron('0 3 * * *')",
            first_run_at=datetime.now(UTC) + timedelta(hours=1), error_backoff_seconds=60, max_consecutive_errors=3,
        ))
    finally:
        await store.close()
TOKEN = "schemathesis-token-0123456789"


@pytest.mark.one_lane
@pytest.mark.parametrize("token", [TOKEN, None], ids=["with-token", "without-token"])
async def test_every_check_passes_on_every_operation(database_url: str, processes: Processes, token: str | None) -> None:
    await _a_schedule(database_url)  # (reached through the document's links from GET /schedules)
    port = free_port()
    env = worker_env(database_url, **({"AGORA_PG_API_TOKEN": token} if token else {}))
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    st = shutil.which("st") or shutil.which("schemathesis")
    command = [st] if st else [sys.executable, "-m", "schemathesis.cli"]
    result = subprocess.run(
        [*command, "run", f"{base}/schema/openapi.json",
         "--checks", "all",
         "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--seed", "20261130",
         *(["--header", f"Authorization: Bearer {token}"] if token else []),
         "--request-timeout", "10",
         # A stream that never ends has no response to check: its input errors are tested in
         # test_events_processes.py.
         "--exclude-path", "/events"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "no issues found" in result.stdout.lower() or " passed" in result.stdout.lower(), result.stdout[-3000:]
    assert "failed" not in result.stdout.split("SUMMARY")[-1].lower(), result.stdout[-3000:]
    code, output = stop(api)
    assert code == 0, output
    assert "Traceback" not in output, output
