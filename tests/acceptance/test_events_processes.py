"""``GET /events`` from an ``agora-pg api`` process while an ``agora-pg worker`` process
runs the example worker: live state changes and progress, a reconnect with
``Last-Event-ID`` that gets what it missed, the token guard."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from ..conftest import Processes
from .test_api_processes import REPO, cli, wait_ready, wait_status
from .test_worker_processes import free_port, stop, worker_env


async def sse_events(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Events of an SSE response as dicts: ``id`` (or None), ``event``, ``data`` (parsed)."""
    fields: dict[str, str] = {}
    async for line in response.aiter_lines():
        if line == "":
            if "event" in fields:
                yield {"id": fields.get("id"), "event": fields["event"], "data": json.loads(fields.get("data", "{}"))}
            fields = {}
        elif not line.startswith(":") and ":" in line:
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")


async def collect(response: httpx.Response, until: Any, timeout: float = 30) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []

    async def read() -> None:
        async for event in sse_events(response):
            got.append(event)
            if until(event):
                return

    await asyncio.wait_for(read(), timeout)
    return got


@pytest.mark.connections(20)
async def test_events_follow_jobs_of_a_worker_process_and_replay_after_a_reconnect(
    database_url: str, processes: Processes
) -> None:
    port = free_port()
    env = worker_env(database_url)
    api = processes.start(cli("api", "--port", str(port)), env, REPO)
    worker = processes.start(cli("worker", "--module", "worker", "--health-port", str(free_port())), env, REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base, timeout=httpx.Timeout(10, read=30)) as client:
        async with client.stream("GET", "/events", params={"kind": "sleep"}) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            created = (await client.post("/jobs", json={"kind": "sleep", "payload": {"seconds": 2}})).json()
            await client.post("/jobs", json={"kind": "echo"})  # another kind: filtered out
            seen = await collect(response, lambda e: e["event"] == "job.finished")
        names = [event["event"] for event in seen]
        assert names[0] == "job.enqueued" and names[-1] == "job.finished", names
        assert "job.started" in names
        progress = [event["data"]["progress"]["done"] for event in seen if event["event"] == "job.progress"]
        assert len(progress) >= 3 and progress == sorted(progress), progress  # throttled, in order
        assert {event["data"]["job_id"] for event in seen} == {created["id"]}
        assert all(event["id"] is not None for event in seen if event["event"] != "job.progress")
        assert seen[-1]["data"]["outcome"] == "succeeded" and seen[-1]["data"]["progress"]["done"] == 10
        assert (await client.get(f"/jobs/{created['id']}")).json()["progress"]["message"] == "slept 2 of 2 s"

        # A client that drops after the job started, and comes back after it ended.
        async with client.stream("GET", "/events", params={"kind": "sleep"}) as response:
            second = (await client.post("/jobs", json={"kind": "sleep", "payload": {"seconds": 1}})).json()
            before = await collect(response, lambda e: e["event"] == "job.started")
        last_id = [event["id"] for event in before if event["id"] is not None][-1]
        await wait_status(client, second["id"], "done")
        async with client.stream("GET", "/events", params={"kind": "sleep"},
                                 headers={"Last-Event-ID": last_id}) as response:
            after = await collect(response, lambda e: e["event"] == "job.finished"
                                  and e["data"]["job_id"] == second["id"])
        assert after[-1]["data"]["job_id"] == second["id"]
        assert not any(event["event"] == "job.progress" for event in after)  # progress is live only
        # the same cursor as the documented `since` parameter (an event id, not a time)
        async with client.stream("GET", "/events", params={"kind": "sleep", "since": last_id}) as response:
            again = await collect(response, lambda e: e["event"] == "job.finished"
                                  and e["data"]["job_id"] == second["id"])
        assert [event["event"] for event in again] == [event["event"] for event in after]

        bad = await client.get("/events", headers={"Last-Event-ID": "yesterday"})
        assert bad.status_code == 400 and bad.json()["field"] == "Last-Event-ID"
        assert (await client.get("/events", params={"job_id": "x"})).status_code == 400
    code, output = stop(worker)
    assert code == 0, output
    code, output = stop(api)
    assert code == 0, output


async def test_events_need_the_token_when_one_is_set(database_url: str, processes: Processes) -> None:
    port = free_port()
    token = "0123456789abcdefghij"
    api = processes.start(cli("api", "--port", str(port)), worker_env(database_url, AGORA_PG_API_TOKEN=token), REPO)
    base = f"http://127.0.0.1:{port}"
    await wait_ready(base, api)
    async with httpx.AsyncClient(base_url=base, timeout=10) as client:
        assert (await client.get("/events")).status_code == 401
        async with client.stream("GET", "/events", headers={"Authorization": f"Bearer {token}"}) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                assert line.startswith("retry:")
                break
    code, output = stop(api)
    assert code == 0, output
