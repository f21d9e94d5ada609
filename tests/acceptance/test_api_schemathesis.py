"""Schemathesis against the served OpenAPI schema: no generated request gets a 5xx."""

from __future__ import annotations

import shutil
import subprocess
import sys

from ..conftest import Processes
from .test_api_processes import REPO, cli, wait_ready
from .test_worker_processes import free_port, stop, worker_env

EXAMPLES_PER_OPERATION = 200
TOKEN = "schemathesis-token-0123456789"


async def test_no_generated_request_gets_a_server_error(database_url: str, processes: Processes) -> None:
    port = free_port()
    api = processes.start(cli("api", "--port", str(port)), worker_env(database_url, AGORA_PG_API_TOKEN=TOKEN), REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    st = shutil.which("st") or shutil.which("schemathesis")
    command = [st] if st else [sys.executable, "-m", "schemathesis.cli"]
    result = subprocess.run(
        [*command, "run", f"{base}/schema/openapi.json",
         "--checks", "not_a_server_error",
         "--max-examples", str(EXAMPLES_PER_OPERATION),
         "--seed", "20261130",
         "--header", f"Authorization: Bearer {TOKEN}",
         "--request-timeout", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=900,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert "passed" in result.stdout.lower() or "no issues found" in result.stdout.lower(), result.stdout[-3000:]
    code, output = stop(api)
    assert code == 0, output
    assert "Traceback" not in output, output
