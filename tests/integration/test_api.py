"""The REST API through Litestar's test client, on a real database."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from litestar.testing import AsyncTestClient

from agora_pg.api import create_app
from agora_pg.api.schemas import RunOut
from agora_pg.db import queries
from agora_pg.db.schedule_rows import ScheduleRegistration
from agora_pg.db.store import Store
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job
from agora_pg.queue import Queue
from agora_pg.runner import Schedule, ScheduledPipeline
from agora_pg.settings import Settings
from agora_pg.worker.handlers import Handlers

from .helpers import record_failure

TOKEN = "s3cret-token-0123456789"
REPO = Path(__file__).resolve().parents[2]


def api_client(settings: Settings) -> AsyncTestClient:  # type: ignore[type-arg]
    """Litestar's test client on an app that opens its own Store in its lifespan: the
    client runs the app in a thread of its own, whose event loop the test's ``store``
    (used here to set up and check rows) must not be shared with."""
    return AsyncTestClient(app=create_app(settings), base_url="http://api.localhost:8000")


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as test_client:
        yield test_client


async def _finish(store: Store, job_id: int, *, fail: bool) -> None:
    """Claim the job as a worker would and record one outcome."""
    [claimed] = await store.jobs.claim(["default"], 1, "w1", 30, kinds=[(await store.jobs.get(job_id)).kind])
    assert claimed.id == job_id
    if fail:
        await record_failure(store, job_id, claimed.attempt, "w1", "boom")
    else:
        await store.jobs.complete_succeeded([(job_id, claimed.attempt)], "w1")


# -- POST /jobs -------------------------------------------------------------------


async def test_post_job_creates_it_and_a_dedup_hit_returns_the_live_one(client: httpx.AsyncClient) -> None:
    body = {"name": "remind", "kind": "appointment_reminder", "payload": {"appointment_id": 1}, "dedup_key": "a1"}
    created = await client.post("/jobs", json=body)
    assert created.status_code == 201, created.text
    job = created.json()
    assert (job["name"], job["kind"], job["status"], job["payload"], job["max_retries"]) == (
        "remind", "appointment_reminder", "pending", {"appointment_id": 1}, None,  # (its kind's, else the worker's)
    )
    again = await client.post("/jobs", json=body)
    assert again.status_code == 200 and again.json()["id"] == job["id"]


async def test_post_job_keeps_every_field(client: httpx.AsyncClient) -> None:
    when = "2031-05-04T03:02:01+02:00"
    response = await client.post(
        "/jobs", json={"kind": "k", "queue": "q", "priority": 5, "run_at": when, "max_retries": 0}
    )
    assert response.status_code == 201
    job = response.json()
    assert (job["name"], job["queue"], job["priority"], job["max_retries"]) == ("k", "q", 5, 0)
    assert datetime.fromisoformat(job["run_at"]) == datetime(2031, 5, 4, 1, 2, 1, tzinfo=UTC)


@pytest.mark.parametrize(
    ("body", "field", "words"),
    [
        ({"kind": "k", "colour": "red"}, "colour", "unknown"),
        ({"kind": "k", "payload": [1, 2]}, "payload", "object"),
        ({"kind": "k", "payload": "text"}, "payload", "object"),
        ({"kind": ""}, "kind", "length"),
        ({"kind": " padded "}, "kind", "whitespace"),
        ({"kind": "a\u0000b"}, "kind", "NUL"),
        ({"payload": {}}, "kind", "required"),
        ({"kind": "k", "run_at": "2030-01-01T00:00:00"}, "run_at", "timezone"),
        ({"kind": "k", "run_at": "tomorrow"}, "run_at", "RFC 3339"),
        ({"kind": "k", "max_retries": -1}, "max_retries", ">= 0"),
        ({"kind": "k", "priority": 2**40}, "priority", "<="),
        ({"kind": "k", "payload": {"text": "nul \u0000 inside"}}, "payload", "NUL"),
        ({"kind": "k", "queue": "agora:pipelines"}, "queue", "agora-pg's own"),
    ],
)
async def test_post_job_rejects_bad_input_naming_the_field(
    client: httpx.AsyncClient, store: Store, body: dict[str, object], field: str, words: str
) -> None:
    response = await client.post("/jobs", json=body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["status_code"] == 400 and error["field"] == field, error
    assert words.lower() in error["detail"].lower(), error
    assert await store.jobs.search({}, 10) == []


async def test_post_job_rejects_malformed_json(client: httpx.AsyncClient) -> None:
    response = await client.post("/jobs", content=b"{not json", headers={"content-type": "application/json"})
    assert response.status_code == 400
    assert response.json()["status_code"] == 400


async def test_payload_over_the_limit_is_413(store: Store, settings: Settings) -> None:
    async with api_client(settings.replace(api_max_payload_bytes=1000)) as client:
        small = await client.post("/jobs", json={"kind": "k", "payload": {"x": "a" * 900}})
        assert small.status_code == 201
        large = await client.post("/jobs", json={"kind": "k", "payload": {"x": "a" * 2000}})
        assert large.status_code == 413 and large.json()["field"] == "payload"
        huge = await client.post("/jobs", json={"kind": "k", "payload": {"x": "a" * 200_000}})
        assert huge.status_code == 413
    assert len(await store.jobs.search({}, 10)) == 1


# -- reading jobs -----------------------------------------------------------------


async def test_get_job_shows_its_runs(client: httpx.AsyncClient, store: Store) -> None:
    job = (await client.post("/jobs", json={"kind": "k"})).json()
    await _finish(store, job["id"], fail=True)
    shown = (await client.get(f"/jobs/{job['id']}")).json()
    assert (shown["status"], shown["retry_count"], shown["error_message"]) == ("failed", 1, "boom")
    assert [(run["attempt"], run["status"], run["error_type"]) for run in shown["runs"]] == [(1, "failed", "ValueError")]


@pytest.mark.parametrize("path", ["/jobs/999999", "/jobs/99999999999999999999", "/jobs/0"])
async def test_unknown_job_is_404(client: httpx.AsyncClient, path: str) -> None:
    for method, suffix in (("GET", ""), ("POST", "/retry"), ("POST", "/cancel")):
        response = await client.request(method, path + suffix)
        assert response.status_code in (404, 400), response.text
        assert response.status_code == 404 or "job_id" in response.text


async def test_list_jobs_filters_and_pages_stably(client: httpx.AsyncClient) -> None:
    ids = [(await client.post("/jobs", json={"kind": "even" if i % 2 == 0 else "odd", "queue": "q"})).json()["id"]
           for i in range(7)]
    first = (await client.get("/jobs", params={"kind": "even", "limit": 2})).json()
    assert [job["id"] for job in first["items"]] == [ids[6], ids[4]]
    await client.post("/jobs", json={"kind": "even"})  # a new job must not shift the pages
    second = (await client.get("/jobs", params={"kind": "even", "limit": 2, "cursor": first["next_cursor"]})).json()
    assert [job["id"] for job in second["items"]] == [ids[2], ids[0]]
    last = (await client.get("/jobs", params={"kind": "even", "limit": 2, "cursor": second["next_cursor"]})).json()
    assert last == {"items": [], "next_cursor": None}
    pending_q = (await client.get("/jobs", params={"status": "pending", "queue": "q", "limit": 50})).json()
    assert sorted(job["id"] for job in pending_q["items"]) == ids and pending_q["next_cursor"] is None


@pytest.mark.parametrize(
    ("params", "field"),
    [({"status": "sleeping"}, "status"), ({"limit": 0}, "limit"), ({"limit": 501}, "limit"),
     ({"cursor": "abc"}, "cursor"), ({"cursor": "-5"}, "cursor"), ({"kind": "a\u0000"}, "kind")],
)
async def test_list_jobs_rejects_bad_filters(client: httpx.AsyncClient, params: dict[str, object], field: str) -> None:
    response = await client.get("/jobs", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field


# -- retry and cancel ----------------------------------------------------------------


async def test_cancel_pending_then_retry_cancelled(client: httpx.AsyncClient) -> None:
    job = (await client.post("/jobs", json={"kind": "k"})).json()
    cancelled = await client.post(f"/jobs/{job['id']}/cancel")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    again = await client.post(f"/jobs/{job['id']}/cancel")
    assert again.status_code == 409 and "cancelled" in again.json()["detail"]
    retried = await client.post(f"/jobs/{job['id']}/retry")
    assert retried.status_code == 200 and retried.json()["status"] == "pending"


async def test_cancel_of_a_running_job_asks_its_worker_and_done_jobs_are_409(
    client: httpx.AsyncClient, store: Store
) -> None:
    job = (await client.post("/jobs", json={"kind": "k"})).json()
    [claimed] = await store.jobs.claim(["default"], 1, "w1", 30, kinds=["k"])
    response = await client.post(f"/jobs/{job['id']}/cancel")
    assert response.status_code == 200, response.text
    asked = response.json()
    assert asked["status"] == "processing" and asked["cancel_requested_at"] is not None
    renewal = await store.workers.renew_leases("w1", 30, [(claimed.id, claimed.attempt)])
    assert renewal.cancel_jobs == {(claimed.id, claimed.attempt)}  # the fallback when the NOTIFY is missed
    await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w1")  # it finished first
    for action in ("retry", "cancel"):
        response = await client.post(f"/jobs/{job['id']}/{action}")
        assert response.status_code == 409 and "done" in response.json()["detail"]


async def test_retry_failed_job_runs_again(client: httpx.AsyncClient, store: Store) -> None:
    job = (await client.post("/jobs", json={"kind": "k", "max_retries": 1})).json()
    await _finish(store, job["id"], fail=True)
    retried = (await client.post(f"/jobs/{job['id']}/retry")).json()
    assert (retried["status"], retried["retry_count"]) == ("pending", 1)
    await _finish(store, job["id"], fail=False)
    assert (await client.get(f"/jobs/{job['id']}")).json()["status"] == "done"


async def test_retry_is_409_when_a_live_job_holds_the_dedup_key(client: httpx.AsyncClient) -> None:
    first = (await client.post("/jobs", json={"kind": "k", "dedup_key": "d"})).json()
    await client.post(f"/jobs/{first['id']}/cancel")
    second = await client.post("/jobs", json={"kind": "k", "dedup_key": "d"})
    assert second.status_code == 201
    response = await client.post(f"/jobs/{first['id']}/retry")
    assert response.status_code == 409 and "dedup_key" in response.json()["detail"]


# -- schedules ------------------------------------------------------------------------


async def _register(store: Store, pipeline_id: str) -> None:
    await store.schedules.upsert(ScheduleRegistration(
        pipeline_id=pipeline_id, kind="every", spec="every(seconds=60)",
        first_run_at=datetime.now(UTC) + timedelta(hours=1), error_backoff_seconds=60, max_consecutive_errors=3,
    ))


async def test_schedules_list_show_pause_resume_trigger(client: httpx.AsyncClient, store: Store) -> None:
    await _register(store, "b-report")
    await _register(store, "a-ingest")
    listed = (await client.get("/schedules")).json()
    assert [row["pipeline_id"] for row in listed] == ["a-ingest", "b-report"]
    shown = (await client.get("/schedules/a-ingest")).json()
    assert (shown["state"], shown["running"], shown["schedule_spec"]) == ("active", False, "every(seconds=60)")

    assert (await client.post("/schedules/a-ingest/pause")).json()["state"] == "paused"
    assert await store.schedules.enqueue_due_ticks([("a-ingest", "every(seconds=60)")], _plan("a-ingest")) == []
    refused = await client.post("/schedules/a-ingest/trigger")
    assert refused.status_code == 409 and "paused" in refused.json()["detail"]
    assert (await client.post("/schedules/a-ingest/resume")).json()["state"] == "active"

    triggered = (await client.post("/schedules/a-ingest/trigger")).json()
    assert datetime.fromisoformat(triggered["next_run_at"]) <= datetime.now(UTC)
    await _start_run(store, "a-ingest")
    running = await client.post("/schedules/a-ingest/trigger")
    assert running.status_code == 409 and "running" in running.json()["detail"]


async def test_pause_during_a_run_survives_its_end(client: httpx.AsyncClient, store: Store) -> None:
    await _register(store, "p")
    await client.post("/schedules/p/trigger")
    claimed = await _start_run(store, "p")
    assert (await client.get("/schedules/p")).json()["running"] is True
    await client.post("/schedules/p/pause")
    assert await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w1") == {claimed.id}
    shown = (await client.get("/schedules/p")).json()
    assert (shown["state"], shown["running"], shown["last_status"]) == ("paused", False, "succeeded")


def _plan(pipeline_id: str) -> Any:
    """How a scheduler turns the due tick of ``pipeline_id`` into its run's job."""
    return ScheduledPipeline(lambda: None, Schedule.every(seconds=60), pipeline_id).plan


async def _start_run(store: Store, pipeline_id: str) -> Job:
    """A run of ``pipeline_id``, due now, enqueued and claimed by worker w1."""
    [(_, job)] = await store.schedules.enqueue_due_ticks([(pipeline_id, "every(seconds=60)")], _plan(pipeline_id))
    [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 10, "w1", 30, kinds=[pipeline_id])
    assert claimed.id == job.id
    return claimed


async def test_unknown_schedule_is_404(client: httpx.AsyncClient) -> None:
    for method, path in (("GET", "/schedules/nope"), ("POST", "/schedules/nope/pause"),
                         ("POST", "/schedules/nope/resume"), ("POST", "/schedules/nope/trigger")):
        response = await client.request(method, path)
        assert response.status_code == 404, (method, path, response.text)


# -- runs --------------------------------------------------------------------------------


async def test_runs_filter_by_job_status_and_time(client: httpx.AsyncClient, store: Store) -> None:
    failed = (await client.post("/jobs", json={"kind": "k"})).json()
    await _finish(store, failed["id"], fail=True)
    done = (await client.post("/jobs", json={"kind": "k", "run_at": "2000-01-01T00:00:00Z"})).json()
    await _finish(store, done["id"], fail=False)
    everything = (await client.get("/runs")).json()["items"]
    assert [run["job_id"] for run in everything] == [done["id"], failed["id"]]
    only_failed = (await client.get("/runs", params={"status": "failed"})).json()["items"]
    assert [run["job_id"] for run in only_failed] == [failed["id"]]
    by_job = (await client.get("/runs", params={"job_id": done["id"]})).json()["items"]
    assert [run["status"] for run in by_job] == ["succeeded"]
    future = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    assert (await client.get("/runs", params={"since": future})).json()["items"] == []
    assert len((await client.get("/runs", params={"until": future})).json()["items"]) == 2
    page = (await client.get("/runs", params={"limit": 1})).json()
    rest = (await client.get("/runs", params={"limit": 1, "cursor": page["next_cursor"]})).json()
    assert [run["job_id"] for run in page["items"] + rest["items"]] == [done["id"], failed["id"]]


@pytest.mark.parametrize(
    ("params", "field"),
    [({"since": "2030-01-01T00:00:00"}, "since"), ({"status": "exploded"}, "status"),
     ({"job_id": "x"}, "job_id"), ({"job_id": str(2**70)}, "job_id")],
)
async def test_runs_reject_bad_filters(client: httpx.AsyncClient, params: dict[str, str], field: str) -> None:
    response = await client.get("/runs", params=params)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == field


# -- probes, metrics, auth ------------------------------------------------------------------


async def test_health_ready_and_metrics(client: httpx.AsyncClient, store: Store) -> None:
    assert (await client.get("/health")).json() == {"status": "ok", "detail": None, "revision": None}
    ready = await client.get("/ready")
    assert ready.status_code == 200 and ready.json()["status"] == "ready"
    await client.post("/jobs", json={"kind": "k", "queue": "mail", "run_at": "2000-01-01T00:00:00Z"})
    await client.post("/jobs", json={"kind": "k"})
    await _finish(store, (await client.post("/jobs", json={"kind": "k", "run_at": "2000-01-01T00:00:00Z"})).json()["id"],
                  fail=True)
    await _register(store, "s")
    text = (await client.get("/metrics")).text
    assert 'agora_jobs{queue="mail",status="pending"} 1.0' in text
    assert 'agora_jobs{queue="default",status="retrying"} 1.0' in text
    assert 'agora_schedules{state="active"} 1.0' in text
    age = next(line for line in text.splitlines() if line.startswith('agora_oldest_due_job_age_seconds{queue="mail"}'))
    assert float(age.split()[-1]) > 20 * 365 * 86400


async def test_ready_is_503_when_the_schema_is_behind(store: Store, settings: Settings) -> None:
    from agora_pg.db import migrate

    await migrate.downgrade(store, "0001")
    async with api_client(settings) as client:
        response = await client.get("/ready")
    assert response.status_code == 503 and "agora-pg migrate" in response.json()["detail"]


async def test_token_guards_everything_but_the_probes(store: Store, settings: Settings) -> None:
    async with api_client(settings.replace(api_token=TOKEN)) as client:
        assert (await client.get("/health")).status_code == 200
        assert (await client.get("/ready")).status_code == 200
        for method, path in (("GET", "/jobs"), ("POST", "/jobs"), ("GET", "/metrics"), ("GET", "/runs"),
                             ("GET", "/schedules"), ("GET", "/schema/openapi.json")):
            response = await client.request(method, path, json={"kind": "k"} if method == "POST" else None)
            assert response.status_code == 401, (path, response.text)
            assert response.headers["www-authenticate"].startswith("Bearer")
        wrong = await client.get("/jobs", headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
        assert wrong.status_code == 401
        right = await client.post("/jobs", json={"kind": "k"}, headers={"Authorization": f"Bearer {TOKEN}"})
        assert right.status_code == 201
    assert len(await store.jobs.search({}, 10)) == 1


async def test_without_a_token_cross_site_and_rebound_requests_are_refused(store: Store, settings: Settings) -> None:
    """A page the developer visits can neither write (a cross-site POST) nor read through
    DNS rebinding (its own name pointed at 127.0.0.1) an API that has no token."""
    await _register(store, "p1")
    async with api_client(settings) as client:
        for method, path in (("POST", "/jobs"), ("POST", "/schedules/p1/pause"), ("GET", "/jobs")):
            cross_site = await client.request(method, path, json={"kind": "k"} if path == "/jobs" else None,
                                              headers={"Origin": "https://evil.example"})
            assert cross_site.status_code == 403, cross_site.text
            assert "AGORA_PG_API_ALLOWED_ORIGINS" in cross_site.json()["detail"]
        rebound = await client.get("/jobs", headers={"Host": "evil.example:8000"})
        assert rebound.status_code == 403 and "Host: evil.example:8000" in rebound.json()["detail"]
        for host in ("127.0.0.1:8000", "[::1]:8000", "app.localhost", "localhost"):
            assert (await client.get("/jobs", headers={"Host": host})).status_code == 200, host
        same_origin = await client.post("/jobs", json={"kind": "k"}, headers={"Origin": "http://api.localhost:8000"})
        assert same_origin.status_code == 201, same_origin.text
    allowed = settings.replace(api_allowed_origins=("http://localhost:3000",))
    async with api_client(allowed) as client:
        response = await client.post("/jobs", json={"kind": "k"}, headers={"Origin": "http://localhost:3000"})
        assert response.status_code == 201, response.text
    async with api_client(settings.replace(api_token=TOKEN)) as client:  # the token is the protection
        response = await client.post("/jobs", json={"kind": "k"}, headers={
            "Origin": "https://evil.example", "Host": "api.example", "Authorization": f"Bearer {TOKEN}"})
        assert response.status_code == 201, response.text
    assert len(await store.jobs.search({}, 10)) == 3
    paused = await store.schedules.get("p1")
    assert paused is not None and paused.state == "active"


async def test_without_a_token_the_app_answers_no_remote_client_whatever_serves_it(settings: Settings) -> None:
    """The app itself (not only ``agora-pg api``) refuses a client whose address is not
    loopback when it has no token; ``allow_remote`` (``--insecure``) lets it through."""
    app = create_app(settings)
    remote = httpx.ASGITransport(app=app, client=("192.0.2.7", 40000))
    async with httpx.AsyncClient(transport=remote, base_url="http://api.localhost:8000") as client:
        response = await client.get("/health")
    assert response.status_code == 403 and "clients on this machine" in response.json()["detail"]
    insecure = httpx.ASGITransport(app=create_app(settings, allow_remote=True), client=("192.0.2.7", 40000))
    async with httpx.AsyncClient(transport=insecure, base_url="http://api.example:8000") as client:
        assert (await client.get("/health")).status_code == 200
        cross_site = await client.post("/jobs", json={"kind": "k"}, headers={"Origin": "https://evil.example"})
        assert cross_site.status_code == 403


async def test_times_the_database_cannot_hold_are_a_400_naming_the_field(client: httpx.AsyncClient) -> None:
    for run_at in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59.999999Z", "9999-12-31T23:59:59-14:00"):
        response = await client.post("/jobs", json={"kind": "k", "run_at": run_at})
        assert response.status_code == 400, (run_at, response.text)
        assert response.json()["field"] == "run_at" and "between 1970-01-01 and 9000-01-01" in response.json()["detail"]
    for query in ("since=0001-01-01T00:00:00%2B14:00", "until=9999-12-31T23:59:59-14:00"):
        response = await client.get(f"/runs?{query}")
        assert response.status_code == 400, (query, response.text)
        assert response.json()["field"] == query.split("=")[0]
    assert (await client.get("/metrics")).status_code == 200
    assert (await client.get("/jobs")).json()["items"] == []


async def test_times_are_rfc_3339_text_not_seconds(client: httpx.AsyncClient) -> None:
    for run_at in (1767225600, "1767225600", 1.5, True):
        response = await client.post("/jobs", json={"kind": "k", "run_at": run_at})
        assert response.status_code == 400 and response.json()["field"] == "run_at", (run_at, response.text)
    for query in ("since=1767225600", "until=2026-01-01", "since=yesterday"):
        response = await client.get(f"/runs?{query}")
        assert response.status_code == 400 and "RFC 3339" in response.json()["detail"], (query, response.text)
    assert (await client.get("/runs?since=2026-01-01T00:00:00Z")).status_code == 200
    assert (await client.get("/jobs")).json()["items"] == []


async def test_the_openapi_document_says_what_the_api_answers(settings: Settings) -> None:
    async with api_client(settings.replace(api_token=TOKEN)) as client:
        document = (await client.get("/schema/openapi.json", headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert document["components"]["securitySchemes"] == {"bearer": {"type": "http", "scheme": "bearer"}}
    job_create = document["components"]["schemas"]["JobCreate"]
    assert job_create["additionalProperties"] is False
    assert job_create["properties"]["max_retries"]["anyOf"][0]["minimum"] == 0
    post_jobs = document["paths"]["/jobs"]["post"]
    assert {"200", "201", "400", "401", "413", "415", "503"} <= set(post_jobs["responses"])
    cancel = document["paths"]["/jobs/{job_id}/cancel"]["post"]
    assert {"401", "404", "409", "503"} <= set(cancel["responses"]) and cancel["security"] == [{"bearer": []}]
    cursor = next(p for p in document["paths"]["/jobs"]["get"]["parameters"] if p["name"] == "cursor")
    assert cursor["schema"]["pattern"] == "^[1-9][0-9]{0,17}$"
    assert "security" not in document["paths"]["/ready"]["get"]


async def test_deep_nesting_and_repeated_keys_are_a_400(client: httpx.AsyncClient) -> None:
    for depth in (65, 975, 5000):
        body = '{"kind": "k", "payload": {"x": ' + "[" * (depth - 1) + "]" * (depth - 1) + "}}"
        response = await client.post("/jobs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400, (depth, response.text[:300])
        assert "nested deeper than 64 levels" in response.json()["detail"]
    ok = '{"kind": "k", "payload": {"x": ' + "[" * 63 + "]" * 63 + "}}"
    response = await client.post("/jobs", content=ok, headers={"content-type": "application/json"})
    assert response.status_code == 201, response.text[:300]
    for body in ('{"kind": "a", "kind": "b"}', '{"kind": "a", "payload": {"n": 1, "n": 2}}'):
        response = await client.post("/jobs", content=body, headers={"content-type": "application/json"})
        assert response.status_code == 400 and "appears twice" in response.json()["detail"], response.text
    text = await client.post("/jobs", json={"kind": "k", "payload": {"path": "C:\\u0000"}})
    assert text.status_code == 201 and text.json()["payload"] == {"path": "C:\\u0000"}, text.text
    assert len((await client.get("/jobs")).json()["items"]) == 2


async def test_job_ids_in_paths_are_plain_digits(client: httpx.AsyncClient) -> None:
    created = (await client.post("/jobs", json={"kind": "k"})).json()
    assert (await client.get(f"/jobs/{created['id']}")).status_code == 200
    for path in ("/jobs/01", "/jobs/+1", "/jobs/%D9%A3", "/jobs/01/retry", "/jobs/+1/cancel"):
        method = "POST" if path.count("/") == 3 else "GET"
        response = await client.request(method, path)
        assert response.status_code == 404, (path, response.text)
    assert (await client.get(f"/jobs/{created['id']}")).json()["status"] == "pending"


async def test_metrics_name_the_busiest_queues_and_sum_the_rest(client: httpx.AsyncClient, store: Store) -> None:
    await store.jobs.enqueue([JobSpec("k", queue=f"q{n:03d}") for n in range(80)])
    text = (await client.get("/metrics")).text
    queues = {line.split('queue="')[1].split('"')[0] for line in text.splitlines() if line.startswith("agora_jobs{")}
    assert len(queues) == 51 and "other" in queues, sorted(queues)
    assert 'agora_jobs{queue="other",status="pending"} 30.0' in text


async def test_a_body_not_sent_as_json_empty_or_broken_is_refused_saying_why(client: httpx.AsyncClient) -> None:
    for content_type in ("text/plain", "application/x-www-form-urlencoded"):
        response = await client.post("/jobs", content=b'{"kind": "k"}', headers={"content-type": content_type})
        assert response.status_code == 415, response.text
        assert response.json()["detail"].startswith(f"Content-Type must be application/json, got '{content_type}'")
    cases = [
        (b"", "the request body is empty"),
        (b"  ", "the request body is empty"),
        (b'{"kind": "k", "payload": {"note": "\\ud800"}}', "lone surrogate escape"),
        (b'{"kind": "\\udfff x"}', "lone surrogate escape"),
        (b'{"kind":', "the request body is not complete JSON"),
        (b'{"kind": "\xff"}', "the request body is not UTF-8 text"),
    ]
    for content, words in cases:
        response = await client.post("/jobs", content=content, headers={"content-type": "application/json"})
        assert response.status_code == 400 and words in response.json()["detail"], (content, response.text)
    pair = await client.post("/jobs", content=b'{"kind": "k", "payload": {"smile": "\\ud83d\\ude00"}}',
                             headers={"content-type": "application/json; charset=utf-8"})
    assert pair.status_code == 201 and pair.json()["payload"] == {"smile": "\U0001F600"}
    vendor = await client.post("/jobs", content=b'{"kind": "k"}', headers={"content-type": "application/vnd.x+json"})
    assert vendor.status_code == 201
    assert (await client.get("/jobs")).status_code == 200  # no body needed elsewhere


async def test_a_database_that_is_down_is_a_503_that_does_not_show_where_it_is(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    down = settings.replace(database_url="postgresql://secret_user@127.0.0.1:1/agora?password=hunter2",
                            database_timeout=2)
    async with api_client(down) as client:
        for response in (await client.post("/jobs", json={"kind": "k"}), await client.get("/ready"),
                         await client.get("/jobs")):
            assert response.status_code == 503, response.text
            assert "secret_user" not in response.text and "127.0.0.1" not in response.text
            assert "hunter2" not in response.text and "agora" not in response.text.replace("agora-pg", "")
            assert "the database is unavailable" in response.text
    assert "secret_user" in caplog.text  # the operator still learns where it tried...
    assert "hunter2" not in caplog.text and "password=***" in caplog.text  # ...but not the password


async def test_the_documentation_page_loads_nothing_from_elsewhere(client: httpx.AsyncClient) -> None:
    page = await client.get("/schema")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    sources = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert sources == ["/schema/static/redoc/redoc.standalone.js"], sources
    script = await client.get(sources[0])
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert hashlib.sha256(script.content).hexdigest() in (REPO / "agora_pg/api/static/redoc/README.md").read_text()


async def test_a_job_no_live_worker_handles_comes_back_with_a_warning(
    client: httpx.AsyncClient, store: Store, settings: Settings
) -> None:
    alone = (await client.post("/jobs", json={"kind": "echo"})).json()
    assert alone["warning"] == ("no live worker of queue 'default' handles kind 'echo': the job waits until one "
                                "does (none is running)")
    await store.workers.register("w-echo", "host", 1, ["default"], ["echo", "add"])
    typo = (await client.post("/jobs", json={"kind": "ecoh"})).json()
    assert typo["warning"] == ("no live worker of queue 'default' handles kind 'ecoh': the job waits until one "
                               "does (they handle add, echo)")
    assert typo["status"] == "pending"  # stored all the same: a worker may come that handles it
    assert (await client.post("/jobs", json={"kind": "echo"})).json()["warning"] is None
    other_queue = (await client.post("/jobs", json={"kind": "echo", "queue": "mail"})).json()
    assert "of queue 'mail'" in other_queue["warning"]
    await store.workers.register("w-old", "host", 2, ["default"])  # a worker that does not say: it counts
    assert (await client.post("/jobs", json={"kind": "ecoh"})).json()["warning"] is None


async def test_unknown_kinds_are_refused_when_asked_and_the_kinds_are_known(settings: Settings, store: Store) -> None:
    handlers = Handlers()

    @handlers.kind("echo")
    async def echo(job: object, resources: object) -> None: ...

    app = create_app(settings.replace(api_refuse_unknown_kinds=True), handlers=handlers)
    async with AsyncTestClient(app=app, base_url="http://api.localhost:8000") as client:
        refused = await client.post("/jobs", json={"kind": "ecoh"})
        assert refused.status_code == 400, refused.text
        assert "unknown kind 'ecoh': the worker module registers echo" in refused.text
        assert (await client.post("/jobs", json={"kind": "echo"})).status_code == 201
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE kind = 'ecoh'") == 0
    # without the kinds, nothing can be refused: the setting alone changes nothing
    async with AsyncTestClient(app=create_app(settings.replace(api_refuse_unknown_kinds=True)),
                               base_url="http://api.localhost:8000") as client:
        assert (await client.post("/jobs", json={"kind": "ecoh"})).status_code == 201


async def test_bulk_retry_and_cancel_act_on_the_jobs_a_filter_matches(
    client: httpx.AsyncClient, queue: Queue, store: Store
) -> None:
    failed = []
    for n in range(3):
        job = await queue.enqueue("report", {"n": n}, max_retries=0)
        [claimed] = await store.jobs.claim(["default"], 1, "w1", 30, kinds=["mail", "report"])
        await record_failure(store, claimed.id, claimed.attempt, "w1", "ValueError: broke")
        failed.append(job.id)
    other_kind = await queue.enqueue("mail", max_retries=0)
    [claimed] = await store.jobs.claim(["default"], 1, "w1", 30, kinds=["mail", "report"])
    await record_failure(store, claimed.id, claimed.attempt, "w1", "ValueError: broke")
    waiting = await queue.enqueue("report", {"n": 9})
    retried = (await client.post("/jobs/bulk/retry", params={"kind": "report"})).json()
    assert sorted(retried["changed"]) == failed and retried["unchanged"] == 1  # the pending one: nothing to retry
    assert (await store.jobs.get(other_kind.id)).status.value == "failed"  # another kind: untouched
    assert [(await store.jobs.get(job_id)).status.value for job_id in failed] == ["pending"] * 3
    cancelled = (await client.post("/jobs/bulk/cancel", params={"kind": "report", "search": "9"})).json()
    assert cancelled == {"changed": [waiting.id], "unchanged": 0}
    assert (await client.post("/jobs/bulk/retry", params={"status": "exploded"})).status_code == 400
    listed = (await client.get("/ui/fragments/jobs", params={"status": "failed", "kind": "mail"})).text
    assert 'hx-post="/jobs/bulk/retry?status=failed&amp;kind=mail"' in listed


async def test_the_events_stream_is_documented_as_it_answers(client: httpx.AsyncClient) -> None:
    document = (await client.get("/schema/openapi.json")).json()
    events = document["paths"]["/events"]["get"]
    parameters = {parameter["name"]: parameter for parameter in events["parameters"]}
    assert parameters["since"]["schema"]["pattern"] == "^[0-9]{1,17}$"
    assert "format" not in parameters["since"]["schema"]
    assert parameters["Last-Event-ID"]["in"] == "header"
    assert list(events["responses"]["200"]["content"]) == ["text/event-stream"]
    # what the document says is what the stream does
    as_time = await client.get("/events", params={"since": "2026-12-06T00:00:00Z"})
    assert as_time.status_code == 400 and as_time.json()["field"] == "since"
    header = await client.get("/events", headers={"Last-Event-ID": "yesterday"})
    assert header.status_code == 400 and header.json()["field"] == "Last-Event-ID"
    # (a stream from a real server, with a cursor the pattern takes: test_events_processes)
    assert re.fullmatch(parameters["since"]["schema"]["pattern"], str(int(datetime.now(UTC).timestamp() * 1e6)))


async def test_the_getting_started_samples_show_every_field_the_api_answers(client: httpx.AsyncClient) -> None:
    """The curl session of docs/getting-started.md is real output: no field missing or stale."""
    lines = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8").splitlines()
    [posted, got] = [json.loads(line) for line in lines if line.startswith('{"id":2,"name":"hello"')]
    [runs] = [json.loads(line) for line in lines if line.startswith('{"items":[{"id":2,')]
    created = await client.post("/jobs", json={"name": "hello", "kind": "echo", "payload": {"message": "hi"}})
    job = (await client.get(f"/jobs/{created.json()['id']}")).json()
    assert list(posted) == list(created.json()) and list(got) == list(job)
    assert list(got["runs"][0]) == list(runs["items"][0]) == list(RunOut.__struct_fields__)


@pytest.mark.parametrize(("path", "statuses"), [("/jobs", "pending, processing, done, failed, cancelled"),
                                               ("/runs", "running, succeeded, failed, abandoned, cancelled")])
async def test_a_bad_status_filter_is_answered_with_the_statuses_there_are(
    client: httpx.AsyncClient, path: str, statuses: str
) -> None:
    response = await client.get(path, params={"status": "bogus"})
    assert response.status_code == 400, response.text
    assert response.json()["detail"] == f"status: Invalid enum value 'bogus': expected one of {statuses}"
