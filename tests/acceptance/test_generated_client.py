"""A client no one here wrote: openapi-python-client generates one from the document a real
`agora-pg api` serves (typed kinds included: `--module worker`), with no hand edit and no
warning (a schema it cannot read would drop the operations that use it, as the recursive
JsonValue once dropped JobCreate and POST /jobs), and that client submits, lists, gets and
cancels a job, and reads the API's error bodies."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest

from ..conftest import Processes
from .test_api_processes import REPO, cli, wait_ready
from .test_worker_processes import free_port, stop, worker_env

PACKAGE = "agora_pg_generated_client"


def generate(document: bytes, directory: Path) -> None:
    (directory / "openapi.json").write_bytes(document)
    # (no post hooks: they only format the code with ruff)
    (directory / "config.json").write_text(json.dumps({"post_hooks": []}), encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "openapi_python_client", "generate", "--path", "openapi.json",
         "--output-path", PACKAGE, "--meta", "none", "--config", "config.json", "--fail-on-warning"],
        cwd=directory, capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


@pytest.mark.one_lane
async def test_a_generated_client_submits_lists_gets_and_cancels_a_job(
    database_url: str, processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port()
    api = processes.start(cli("api", "--port", str(port), "--module", "worker"), worker_env(database_url), REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient() as http:
        document = await http.get(f"{base}/schema/openapi.json")
    assert document.status_code == 200, document.text
    generate(document.content, tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        await _drive(base)
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == PACKAGE]:
            del sys.modules[name]
    code, output = stop(api)
    assert code == 0, output
    assert "Traceback" not in output, output


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"{PACKAGE}.{name}")


async def _drive(base: str) -> None:
    models = _module("models")
    create, list_jobs, get, cancel = (_module(f"api.jobs.{name}") for name in (
        "jobs_create_job", "jobs_list_jobs", "jobs_job_id_get_job", "jobs_job_id_cancel_cancel_job"))
    payload: dict[str, Any] = {"message": "hi", "nested": {"list": [1, 2.5, "two", None, True, {"deep": []}]}}
    # (an answer the document does not list raises instead of returning None)
    async with _module("client").Client(base_url=base, raise_on_unexpected_status=True) as client:
        body = models.JobCreate(kind="echo", name="generated", payload=models.JobCreatePayload.from_dict(payload))
        created = await create.asyncio(client=client, body=body)
        assert isinstance(created, models.JobOut), created
        assert (created.kind, created.name, created.status) == ("echo", "generated", models.JobStatus.PENDING)
        assert created.payload.to_dict() == payload

        typed = await create.asyncio(client=client, body=models.JobCreate(
            kind="add", payload=models.JobCreatePayload.from_dict({"a": 1, "b": 2})))
        assert isinstance(typed, models.JobOut) and typed.payload.to_dict() == {"a": 1, "b": 2}, typed
        refused = await create.asyncio(client=client, body=models.JobCreate(
            kind="add", payload=models.JobCreatePayload.from_dict({"a": 1})))
        assert isinstance(refused, models.ErrorBody), refused
        assert (refused.status_code, refused.field) == (400, "payload.b"), refused

        page = await list_jobs.asyncio(client=client, kind="echo")
        assert isinstance(page, models.JobPage), page
        assert [(job.id, job.kind) for job in page.items] == [(created.id, "echo")]

        got = await get.asyncio(client=client, job_id=created.id)
        assert isinstance(got, models.JobOut), got
        assert (got.id, got.kind, got.payload.to_dict()) == (created.id, "echo", payload)

        cancelled = await cancel.asyncio(client=client, job_id=created.id)
        assert isinstance(cancelled, models.JobOut), cancelled
        assert (cancelled.id, cancelled.status) == (created.id, models.JobStatus.CANCELLED)
        again = await get.asyncio(client=client, job_id=created.id)
        assert isinstance(again, models.JobOut) and again.status == models.JobStatus.CANCELLED, again
        twice = await cancel.asyncio(client=client, job_id=created.id)
        assert isinstance(twice, models.ErrorBody) and twice.status_code == 409, twice
        missing = await get.asyncio(client=client, job_id=created.id + 1000)
        assert isinstance(missing, models.ErrorBody) and missing.status_code == 404, missing
