"""`agora-pg api`, `agora-pg worker` and `agora-pg dev` as real processes, driven over HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from ..conftest import Processes
from ..faults import outside_address
from .test_worker_processes import eventually, free_port, stop, worker_env

REPO = Path(__file__).resolve().parents[2]


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agora_pg.cli", *args]


async def wait_ready(base: str, process: subprocess.Popen[bytes], timeout: float = 60) -> None:
    async def answers() -> bool:
        assert process.poll() is None, f"exited with {process.returncode}"
        try:
            async with httpx.AsyncClient() as client:
                return (await client.get(f"{base}/ready", timeout=2)).status_code == 200
        except httpx.HTTPError:
            return False

    await eventually(answers, timeout, f"{base}/ready")


async def wait_status(client: httpx.AsyncClient, job_id: int, status: str, timeout: float = 60) -> dict[str, Any]:
    seen: dict[str, Any] = {}

    async def reached() -> bool:
        seen.update((await client.get(f"/jobs/{job_id}")).json())
        return seen["status"] == status

    await eventually(reached, timeout, f"job {job_id} to become {status}")
    return seen


async def test_job_submitted_over_http_is_run_by_a_worker_process(database_url: str, processes: Processes) -> None:
    port = free_port()
    env = worker_env(database_url, WORKER_MAX_RETRIES="2")
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    worker = processes.start(cli("worker", "--module", "worker", "--health-port", str(free_port())), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        created = await client.post("/jobs", json={"name": "hello", "kind": "echo", "payload": {"message": "hi"}})
        assert created.status_code == 201, created.text
        done = await wait_status(client, created.json()["id"], "done")
        assert [run["status"] for run in done["runs"]] == ["succeeded"]

        reminder = await client.post("/jobs", json={"name": "remind", "kind": "appointment_reminder",
                                                    "payload": {"appointment_id": 2, "variant": "sms"}})
        assert reminder.status_code == 201, reminder.text
        reminded = await wait_status(client, reminder.json()["id"], "done")
        assert reminded["result"]["channel"] == "sms" and reminded["result"]["appointment_id"] == 2  # the Reminder

        failing = await client.post("/jobs", json={"kind": "fail"})
        failed = await wait_status(client, failing.json()["id"], "failed")

        async def exhausted() -> bool:
            failed.update((await client.get(f"/jobs/{failing.json()['id']}")).json())
            return failed["retry_count"] == 2

        await eventually(exhausted, 60, "the failing job to use its two attempts")
        assert failed["status"] == "failed" and "always fails" in failed["error_message"]
        assert [run["status"] for run in failed["runs"]] == ["failed", "failed"]
    worker_code, worker_output = stop(worker)
    assert worker_code == 0, worker_output
    assert "reminder for appointment 2 sent by sms to +44 20 7946 0000" in worker_output
    code, output = stop(api)
    assert code == 0, output


async def test_api_refuses_a_public_address_without_a_token(database_url: str, processes: Processes) -> None:
    refused = subprocess.run(cli("api", "--host", "0.0.0.0", "--port", str(free_port())),
                             env=worker_env(database_url), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1].startswith("agora-pg: --host: refusing to serve on 0.0.0.0")


async def test_api_on_a_public_address_with_a_token(database_url: str, processes: Processes) -> None:
    port = free_port()
    token = "0123456789abcdef" * 2
    api = processes.start(cli("api", "--host", "0.0.0.0", "--port", str(port)),
                          worker_env(database_url, AGORA_PG_API_TOKEN=token), REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base) as client:
        assert (await client.get("/jobs")).status_code == 401
        assert (await client.get("/jobs", headers={"Authorization": f"Bearer {token}"})).status_code == 200
    code, output = stop(api)
    assert code == 0, output


async def test_dev_runs_api_and_worker_until_ctrl_c(database_url: str, processes: Processes) -> None:
    port = free_port()
    dev = processes.start(cli("dev", "--port", str(port), "--health-port", str(free_port())),
                          worker_env(database_url), REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, dev)
    children = psutil.Process(dev.pid).children(recursive=True)
    assert len(children) >= 2
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        job = (await client.post("/jobs", json={"kind": "echo", "payload": {"message": "from dev"}})).json()
        await wait_status(client, job["id"], "done")
        # the API knows worker.py's kinds: a typed payload is checked, and the result comes back
        refused = await client.post("/jobs", json={"kind": "add", "payload": {"a": 1, "b": "two"}})
        assert refused.status_code == 400 and refused.json()["field"] == "payload.b", refused.text
        summed = (await client.post("/jobs", json={"kind": "add", "payload": {"a": 1, "b": 2.5}})).json()
        assert summed["max_retries"] == 0  # the kind's
        await wait_status(client, summed["id"], "done")
        assert (await client.get(f"/jobs/{summed['id']}")).json()["result"] == 3.5
        runs = (await client.get("/runs", params={"job_id": job["id"]})).json()["items"]
        assert [run["status"] for run in runs] == ["succeeded"]
        metrics = (await client.get("/metrics")).text
        assert "# TYPE agora_jobs_completed_total counter" in metrics  # (the workers publish every 10 s)
        dashboard = await client.get("/")
        assert dashboard.status_code == 200 and "/ui/fragments/overview" in dashboard.text
    os.kill(dev.pid, signal.SIGINT)
    output, _ = dev.communicate(timeout=60)
    text = output.decode(errors="replace")
    assert dev.returncode == 0, text
    assert f"API on http://127.0.0.1:{port}" in text
    assert f"dashboard on http://127.0.0.1:{port}/" in text
    deadline = time.monotonic() + 30  # (dev has exited: its children must follow, not within any speed)
    while any(child.is_running() and child.status() != psutil.STATUS_ZOMBIE for child in children):
        assert time.monotonic() < deadline, f"children left running after dev exited: {[c.pid for c in children if c.is_running()]}"
        time.sleep(0.1)


def test_jobs_and_runs_commands_print_tables(database_url: str) -> None:
    env = worker_env(database_url)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cli("--log-level", "WARNING", *args), env=env, cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    submitted = run("jobs", "submit", "report", "--payload", json.dumps({"month": 5}), "--queue", "reports")
    assert submitted.returncode == 0, submitted.stderr
    header, _rule, row = submitted.stdout.strip().splitlines()
    assert header.split()[:4] == ["id", "kind", "queue", "status"]
    job_id = row.split()[0]
    assert row.split()[1:4] == ["report", "reports", "pending"]

    listed = run("jobs", "list", "--queue", "reports")
    assert listed.returncode == 0 and job_id in listed.stdout
    shown = run("jobs", "show", job_id)
    assert shown.returncode == 0 and '{"month": 5}' in shown.stdout
    assert run("jobs", "cancel", job_id).stdout.splitlines()[2].split()[3] == "cancelled"
    assert run("jobs", "retry", job_id).stdout.splitlines()[2].split()[3] == "pending"
    assert run("runs", "list").returncode == 0

    for args, words in [
        (("jobs", "submit", "k", "--payload", "[1]"), "--payload: expected a JSON object"),
        (("jobs", "submit", "k", "--run-at", "2030-01-01T00:00:00"), "--run-at: expected a time with a UTC offset"),
        (("jobs", "list", "--status", "asleep"), "--status: expected one of"),
        (("jobs", "show", "99999999"), "job 99999999 does not exist"),
        (("jobs", "retry", job_id, ), f"job {job_id} is pending; it cannot become pending"),
    ]:
        result = run(*args)
        assert result.returncode in (1, 2), (args, result)
        assert result.stderr.strip().splitlines()[-1] == f"agora-pg: {words}" or words in result.stderr, result.stderr
        assert "Traceback" not in result.stderr


def test_api_entry_point_builds_the_app_from_the_environment(database_url: str) -> None:
    probe = (
        "from api.app import app; from litestar import Litestar; "
        "assert isinstance(app, Litestar); print(len(app.guards))"
    )
    for extra, guards in (({}, "0"), ({"AGORA_PG_API_TOKEN": "0123456789abcdefghij"}, "1")):
        result = subprocess.run([sys.executable, "-c", probe], env=worker_env(database_url, **extra), cwd=REPO,
                                capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == guards


async def test_uvicorn_serving_the_app_on_every_address_without_a_token_answers_only_loopback(
    database_url: str, processes: Processes,
) -> None:
    """``uvicorn api.app:app --host 0.0.0.0`` skips agora-pg's start-up check; the app
    itself still refuses clients that are not on this machine."""
    outside = outside_address()
    if outside is None:
        pytest.skip("this machine has no address but loopback")
    port = free_port()
    api = processes.start([sys.executable, "-m", "uvicorn", "api.app:app", "--host", "0.0.0.0", "--port", str(port)],
                          worker_env(database_url), REPO)
    await wait_ready(f"http://127.0.0.1:{port}", api)
    async with httpx.AsyncClient(timeout=10) as client:
        remote = await client.get(f"http://{outside}:{port}/jobs")
        local = await client.get(f"http://127.0.0.1:{port}/jobs")
    assert remote.status_code == 403 and "clients on this machine" in remote.json()["detail"], remote.text
    assert local.status_code == 200, local.text


async def test_a_flood_of_idle_and_slow_connections_is_shed_and_health_still_answers(
    database_url: str, processes: Processes,
) -> None:
    """Idle sockets and half-sent requests are closed after AGORA_PG_API_READ_TIMEOUT;
    meanwhile /health answers; past AGORA_PG_API_MAX_CONNECTIONS requests get a 503
    (not a hang), and the API recovers once the flood is shed."""
    import socket

    port = free_port()
    env = worker_env(database_url, AGORA_PG_API_READ_TIMEOUT="2", AGORA_PG_API_MAX_CONNECTIONS="200",
                     AGORA_PG_API_MAX_CONNECTIONS_PER_CLIENT="200")  # (one address here: the global cap)
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)

    def flood(idle: int, slow: int) -> list[socket.socket]:
        sockets = []
        for number in range(idle + slow):
            connection = socket.create_connection(("127.0.0.1", port), timeout=5)
            if number >= idle:  # headers sent, the body never finished
                connection.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                   b"Content-Length: 100\r\n\r\n{\"kin")
            sockets.append(connection)
        return sockets

    def closed_by_server(connection: socket.socket) -> bool:
        connection.settimeout(5)
        try:
            return connection.recv(1024) == b""
        except (ConnectionResetError, TimeoutError):
            return False

    flooded = await asyncio.to_thread(flood, 100, 50)
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        assert (await client.get("/health")).status_code == 200
    # each read waits at most 5 s (closed_by_server's timeout): the server's 2 s deadline, not forever
    assert all(await asyncio.to_thread(lambda: [closed_by_server(c) for c in flooded]))
    for connection in flooded:
        connection.close()

    # every slot taken by idle sockets: a new connection closes the oldest idle one, so
    # requests keep being answered however fast the flood reopens its sockets
    flooded = await asyncio.to_thread(flood, 200, 0)
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        for _ in range(5):
            assert (await client.get("/health")).status_code == 200
            assert (await client.post("/jobs", json={"kind": "echo"})).status_code == 201
            flooded += await asyncio.to_thread(flood, 5, 0)  # reopened
    for connection in flooded:
        connection.close()

    # every slot taken by requests in progress (bodies half sent): refused at once with a
    # 503, not a hang, until the read deadline sheds them
    flooded = await asyncio.to_thread(flood, 0, 200)
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:
        assert (await client.get("/health")).status_code == 503  # past the limit: refused at once

        async def answered() -> bool:  # once the read deadline (2 s) has shed the flood
            return (await client.get("/health")).status_code == 200

        await eventually(answered, 30, "/health answered 200 once the half-sent requests were shed")
    for connection in flooded:
        connection.close()


async def test_one_client_address_cannot_take_the_slots_of_the_others(database_url: str, processes: Processes) -> None:
    """Past AGORA_PG_API_MAX_CONNECTIONS_PER_CLIENT connections of one address, a new one
    closes that address's oldest idle connection, or (none idle) gets 503 at once; another
    address (127.0.0.2, loopback too) is answered all along."""
    import socket

    port = free_port()
    env = worker_env(database_url, AGORA_PG_API_MAX_CONNECTIONS="100", AGORA_PG_API_MAX_CONNECTIONS_PER_CLIENT="20")
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)

    def connect(busy: bool) -> socket.socket:
        connection = socket.create_connection(("127.0.0.1", port), timeout=5)
        if busy:  # headers sent, the body never finished
            connection.sendall(b"POST /jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                               b"Content-Length: 100\r\n\r\n{\"kin")
        return connection

    def answer(connection: socket.socket, wait: float = 5) -> bytes | None:
        connection.settimeout(wait)
        try:
            return connection.recv(4096)
        except TimeoutError:
            return None

    other = httpx.AsyncClient(base_url=base, timeout=5,
                              transport=httpx.AsyncHTTPTransport(local_address="127.0.0.2"))
    flood = await asyncio.to_thread(lambda: [connect(busy=True) for _ in range(20)])
    try:
        refused = await asyncio.to_thread(connect, False)
        first = await asyncio.to_thread(answer, refused)
        assert first is not None and first.startswith(b"HTTP/1.1 503 ") and b"too many connections from this address" in first, first
        async with httpx.AsyncClient(base_url=base, timeout=5) as same:
            assert (await same.get("/health")).status_code == 503  # (its address is at its cap)
        for _ in range(3):
            assert (await other.get("/health")).status_code == 200
            assert (await other.post("/jobs", json={"kind": "echo"})).status_code == 201
    finally:
        for connection in flood:
            connection.close()
    # idle connections of the address at its cap give way to its new ones
    flood = await asyncio.to_thread(lambda: [connect(busy=False) for _ in range(20)])
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as same:
            for _ in range(3):
                assert (await same.get("/health")).status_code == 200
        assert b"" in await asyncio.to_thread(lambda: [answer(c, 0.1) for c in flood])  # an idle one, closed
    finally:
        for connection in flood:
            connection.close()
        await other.aclose()


@pytest.mark.one_lane
async def test_dev_on_the_embedded_server_reuses_its_data(tmp_path: Path, processes: Processes) -> None:
    """The README's first command on a fresh machine (no DATABASE_URL), run twice."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(AGORA_PG_DATA_DIR=str(tmp_path / ".agora-pg"), PYTHONUNBUFFERED="1", WORKER_POLL_SECONDS="0.2")

    async def dev_session(check: Any) -> str:
        port = free_port()
        dev = processes.start(cli("dev", "--port", str(port), "--health-port", str(free_port())), env, REPO)
        base = f"http://127.0.0.1:{port}"
        await wait_ready(base, dev, timeout=120)
        async with httpx.AsyncClient(base_url=base, timeout=10) as client:
            await check(client)
        os.kill(dev.pid, signal.SIGINT)
        output, _ = dev.communicate(timeout=60)
        assert dev.returncode == 0, output.decode(errors="replace")
        return output.decode(errors="replace")

    job_id: list[int] = []

    async def first(client: httpx.AsyncClient) -> None:
        created = await client.post("/jobs", json={"kind": "echo", "payload": {"message": "kept"}})
        job_id.append(created.json()["id"])
        await wait_status(client, job_id[0], "done")

    async def second(client: httpx.AsyncClient) -> None:
        kept = (await client.get(f"/jobs/{job_id[0]}")).json()
        assert (kept["status"], kept["payload"]) == ("done", {"message": "kept"})

    output = await dev_session(first)
    assert f"host={tmp_path / '.agora-pg'}" in output
    await dev_session(second)


async def test_timeouts_cancels_fail_and_tracebacks_over_http_and_the_cli(
    database_url: str, processes: Processes, tmp_path: Path
) -> None:
    port = free_port()
    env = worker_env(database_url, LEDGER_DIR=str(tmp_path))
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    worker = processes.start(cli("worker", "--module", "worker_app"), env, REPO / "tests" / "acceptance")
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        bad = await client.post("/jobs", json={"kind": "slow", "timeout_seconds": -1})
        assert bad.status_code == 400 and bad.json()["field"] == "timeout_seconds", bad.text

        timed = (await client.post("/jobs", json={"kind": "slow", "payload": {"seconds": 60},
                                                  "timeout_seconds": 0.5, "max_retries": 1})).json()
        assert timed["timeout_seconds"] == 0.5
        failed = await wait_status(client, timed["id"], "failed", timeout=30)
        assert failed["error_message"].startswith("JobTimeout: the attempt ran longer than its timeout of 0.5s")
        assert [run["error_type"] for run in failed["runs"]] == ["JobTimeout"]

        refused = (await client.post("/jobs", json={"kind": "refuse", "payload": {"card": 42}, "max_retries": 5})).json()
        refused = await wait_status(client, refused["id"], "failed", timeout=30)
        assert (refused["retry_count"], refused["max_retries"]) == (1, 1)  # Fail: not retried
        [run] = refused["runs"]
        assert run["traceback"].rstrip().endswith("agora_pg.errors.Fail: card 42 declined")
        assert "in refuse" in run["traceback"]

        for kind, payload in (("slow", {"seconds": 60}), ("sync_sleep", {"seconds": 2})):
            running = (await client.post("/jobs", json={"kind": kind, "payload": payload})).json()
            await wait_status(client, running["id"], "processing", timeout=30)
            asked = await client.post(f"/jobs/{running['id']}/cancel")
            assert asked.status_code == 200 and asked.json()["cancel_requested_at"] is not None, asked.text
            # (the async handler would sleep 60 s: cancelled within the wait's 30 s, it was interrupted)
            cancelled = await wait_status(client, running["id"], "cancelled", timeout=30)
            [run] = cancelled["runs"]
            assert run["status"] == "cancelled"
            if kind == "sync_sleep":  # a sync handler's thread cannot be interrupted: its 2 s ran out first
                ran = datetime.fromisoformat(run["finished_at"]) - datetime.fromisoformat(run["started_at"])
                assert ran.total_seconds() >= 1.9, run  # (a lower bound: load only lengthens it)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(cli(*args), env=env, cwd=REPO, capture_output=True, text=True, timeout=60)

    submitted = run("jobs", "submit", "slow", "--payload", '{"seconds": 60}')
    assert submitted.returncode == 0, submitted.stderr
    job_id = submitted.stdout.splitlines()[2].split()[0]
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        await wait_status(client, int(job_id), "processing", timeout=30)
        cancelled = run("jobs", "cancel", job_id)
        assert cancelled.returncode == 0 and "processing (cancel asked: its worker stops it)" in cancelled.stdout, \
            cancelled.stderr
        await wait_status(client, int(job_id), "cancelled", timeout=10)
    shown = run("jobs", "show", str(refused["id"]))
    assert shown.returncode == 0 and "traceback of run" in shown.stdout and "card 42 declined" in shown.stdout
    listed = run("runs", "list", "--job-id", str(refused["id"]), "--traceback")
    assert listed.returncode == 0 and "agora_pg.errors.Fail: card 42 declined" in listed.stdout
    bad_timeout = run("jobs", "submit", "slow", "--timeout", "0")
    assert bad_timeout.returncode == 2
    assert bad_timeout.stderr.strip().splitlines() == [
        "agora-pg: timeout_seconds: must be more than 0 and at most 31536000 seconds (a year), got 0.0"
    ]
    for process in (worker, api):
        code, output = stop(process)
        assert code == 0, output[-3000:]


async def test_event_streams_have_a_cap_of_their_own_and_leave_slots_to_other_requests(
    database_url: str, processes: Processes,
) -> None:
    """As many /events streams as a client likes cannot take every connection slot: past
    AGORA_PG_API_MAX_EVENT_STREAMS they get 503 with Retry-After, and /health, POST /jobs
    and the dashboard keep answering."""
    port = free_port()
    env = worker_env(database_url, AGORA_PG_API_MAX_EVENT_STREAMS="3", AGORA_PG_API_MAX_CONNECTIONS="12")
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with contextlib.AsyncExitStack() as held, httpx.AsyncClient(
            base_url=base, timeout=httpx.Timeout(5, read=30), limits=httpx.Limits(max_connections=8)) as client:
        for _ in range(3):
            stream = await held.enter_async_context(client.stream("GET", "/events"))
            assert stream.status_code == 200
        # the flood (at most 5 at once beside the 3 streams: below the 12 connections, the streams cap answers)
        refused = await asyncio.gather(*(client.get("/events") for _ in range(20)))
        assert {answer.status_code for answer in refused} == {503}
        assert refused[0].headers["retry-after"] == "5" and "AGORA_PG_API_MAX_EVENT_STREAMS" in refused[0].text
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/jobs", json={"kind": "echo"})).status_code == 201
        assert (await client.get("/ui/fragments/overview")).status_code == 200
    async with httpx.AsyncClient(base_url=base, timeout=5) as client:  # the streams closed: room again
        async with client.stream("GET", "/events") as stream:
            assert stream.status_code == 200
    code, output = stop(api)
    assert code == 0, output
