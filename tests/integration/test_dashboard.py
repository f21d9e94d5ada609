"""The dashboard's pages and fragments, rendered from a real database (the browser test
is tests/acceptance/test_dashboard_browser.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest

from agora_pg import ConfigError, JobSpec, Queue
from agora_pg.api import create_app
from agora_pg.commands.pipelines import run_once
from agora_pg.runner.assembly import read_config
from agora_pg.db import queries
from agora_pg.db.pipeline_state import PipelineState
from agora_pg.db.schedule_rows import ScheduleRegistration
from agora_pg.db.store import Store
from agora_pg.jobs import JobStatus
from agora_pg.runner.adhoc import enqueue_run
from agora_pg.settings import Settings

from .helpers import record_failure
from .test_api import TOKEN, api_client


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async with api_client(settings) as test_client:
        yield test_client


async def test_pages_are_shells_that_load_their_fragment(client: httpx.AsyncClient) -> None:
    for path, fragment in (("/", "/ui/fragments/overview"), ("/ui/jobs", "/ui/fragments/jobs"),
                           ("/ui/jobs/12", "/ui/fragments/jobs/12"), ("/ui/jobs/x", "/ui/fragments/jobs/0"),
                           ("/ui/schedules", "/ui/fragments/schedules"), ("/ui/runs", "/ui/fragments/runs"),
                           ("/ui/dead-letters", "/ui/fragments/dead-letters")):
        page = await client.get(path)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), path
        assert f'hx-get="{fragment}"' in page.text, path
    script = await client.get("/ui/static/htmx/htmx.min.js")
    assert script.status_code == 200 and len(script.content) > 40_000


async def test_overview_job_and_schedule_fragments_show_the_database(
    client: httpx.AsyncClient, queue: Queue, store: Store
) -> None:
    waiting = await queue.enqueue("mail", {"to": "<b>x</b>"}, queue="mail", run_at=datetime.now(UTC) - timedelta(minutes=3))
    failing = await queue.enqueue("report", max_retries=0)
    await store.workers.register("w-dash", "host", 7, ["default"])
    [claimed] = await store.jobs.claim(["default"], 1, "w-dash", 30, kinds=["mail", "report"])
    assert claimed.id == failing.id
    await record_failure(store, failing.id, claimed.attempt, "w-dash", "ValueError: broke")
    await store.schedules.upsert(ScheduleRegistration(
        pipeline_id="nightly", kind="cron", spec="cron 30 2 * * * UTC",
        first_run_at=datetime.now(UTC) - timedelta(hours=1), error_backoff_seconds=60, max_consecutive_errors=3,
    ))

    overview = (await client.get("/ui/fragments/overview")).text
    assert ">mail</a>" in overview and "3 min" in overview  # the oldest due job's age
    assert "w-dash" in overview  # a worker alive
    assert "1 failed in the last hour" in overview
    assert "nightly" in overview  # overdue with nobody running it

    job = (await client.get(f"/ui/fragments/jobs/{waiting.id}")).text
    assert "&lt;b&gt;x&lt;/b&gt;" in job and "<b>x</b>" not in job  # escaped
    assert f'hx-post="/jobs/{waiting.id}/cancel"' in job and "/retry" not in job
    failed = (await client.get(f"/ui/fragments/jobs/{failing.id}")).text
    assert "ValueError: broke" in failed and f'hx-post="/jobs/{failing.id}/retry"' in failed
    assert "No job 999999" in (await client.get("/ui/fragments/jobs/999999")).text

    listed = (await client.get("/ui/fragments/jobs", params={"status": "failed", "kind": "", "queue": ""})).text
    assert f'href="/ui/jobs/{failing.id}"' in listed and f'href="/ui/jobs/{waiting.id}"' not in listed
    bad = await client.get("/ui/fragments/jobs", params={"status": "exploded"})
    assert bad.status_code == 400 and bad.json()["field"] == "status"

    schedules = (await client.get("/ui/fragments/schedules")).text
    assert "daily at 02:30 (UTC)" in schedules and 'hx-post="/schedules/nightly/pause"' in schedules


async def test_fragments_need_the_token_and_pages_do_not(settings: Settings) -> None:
    async with api_client(settings.replace(api_token=TOKEN)) as client:
        assert (await client.get("/")).status_code == 200
        assert (await client.get("/ui/static/dashboard.js")).status_code == 200
        assert (await client.get("/ui/fragments/overview")).status_code == 401
        answer = await client.get("/ui/fragments/overview", headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code == 200


def _ingest_config(tmp_path: Path) -> Path:
    data = tmp_path / "events.csv"
    data.write_text("id,amount,note\n1,2.5,a\n2,-3.25,b\n", encoding="utf-8")
    config = tmp_path / "ingest.toml"
    config.write_text(f'''format = "agora/v1"

[pipelines.ingest.source]
type = "csv"
path = "{data}"
schema = {{id = "int", amount = "decimal"}}

[pipelines.ingest.schedule]
mode = "once"

[[pipelines.ingest.sinks]]
type = "database"
database_url = "${{AGORA_PG_DATABASE_URL}}"
table = "public.events"
''', encoding="utf-8")
    return config


async def test_dead_letters_replay_through_the_api_and_the_dashboard(
    settings: Settings, store: Store, database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    async with store.connection() as connection:
        await connection.execute(
            "CREATE TABLE public.events (id int PRIMARY KEY, amount numeric CHECK (amount >= 0), note text)"
        )
    config = _ingest_config(tmp_path)
    await run_once(read_config(str(config)), None)  # one row refused by the table: a dead letter
    async with api_client(settings.replace(pipelines_config=config)) as client:
        unknown = await client.post("/dead-letters/orders/replay")
        assert unknown.status_code == 404 and "the API knows: ingest" in unknown.json()["detail"]
        page = (await client.get("/ui/fragments/dead-letters")).text
        assert 'hx-post="/dead-letters/ingest/replay"' in page and "CheckViolationError" in page

        again = (await client.post("/dead-letters/ingest/replay")).json()
        assert (again["replayed"], again["written"], again["rejected_again"]) == (1, 0, 1)
        replay_job = await store.jobs.get(again["job_id"])  # a job of the pipeline, with its run
        assert (replay_job.queue, replay_job.kind, replay_job.status) == (queries.PIPELINE_QUEUE, "ingest", JobStatus.DONE)
        assert [run.id for run in await store.runs.of_job(replay_job.id)] == [again["run_id"]]
        [letter] = await PipelineState(store).waiting_dead_letters("ingest", 10)
        assert letter.job_id == replay_job.id  # rejected again: a new dead letter of the replay's job

        async with store.connection() as connection:
            await connection.execute("ALTER TABLE public.events DROP CONSTRAINT events_amount_check")
        # a run of the pipeline in flight elsewhere (its worker alive): the replay is refused, not queued
        in_flight, _ = await enqueue_run(store, "ingest", run="now")
        [claimed] = await store.jobs.claim([queries.PIPELINE_QUEUE], 1, "elsewhere", 30, kinds=["ingest"])
        busy = await client.post("/dead-letters/ingest/replay")
        assert busy.status_code == 409, busy.text
        assert f"a run of ingest is in flight (job {in_flight.id})" in busy.json()["detail"]
        # that worker dies: once its lease has passed, the replay rescues its run and goes ahead
        async with store.connection() as connection:
            await connection.execute("UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' "
                                     "WHERE id = $1", claimed.id)
        written = (await client.post("/dead-letters/ingest/replay", params={"limit": 10})).json()
        assert (written["replayed"], written["written"], written["rejected_again"]) == (1, 1, 0)
        assert (await store.jobs.get(in_flight.id)).status is JobStatus.FAILED
        nothing = (await client.post("/dead-letters/ingest/replay")).json()
        assert (nothing["replayed"], nothing["job_id"], nothing["run_id"]) == (0, None, None)
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT amount FROM public.events WHERE id = 2") == Decimal("-3.25")


def test_a_bad_pipelines_config_stops_the_api_with_its_name(settings: Settings, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="AGORA_PG_PIPELINES_CONFIG: cannot read"):
        create_app(settings.replace(pipelines_config=tmp_path / "missing.toml"))


async def test_a_jobs_page_shows_its_result_times_and_whether_it_will_retry(
    client: httpx.AsyncClient, queue: Queue, store: Store
) -> None:
    done = await queue.enqueue("add", {"a": 1}, name="monthly total")
    [claimed] = await store.jobs.claim(["default"], 1, "w-dash", 30, kinds=["add", "report"])
    await store.jobs.complete_succeeded([(claimed.id, claimed.attempt)], "w-dash", {done.id: '{"sum": 3}'})
    page = (await client.get(f"/ui/fragments/jobs/{done.id}")).text
    assert "<dt>Name</dt><dd>monthly total</dd>" in page
    assert "<h2>Result</h2>" in page and "&#34;sum&#34;: 3" in page
    for fact in ("Created", "Started", "Finished"):
        assert f"<dt>{fact}</dt>" in page, fact
    assert "<dt>Due</dt>" not in page  # a finished job is due nowhere

    retrying = await queue.enqueue("report", max_retries=3)
    [claimed] = await store.jobs.claim(["default"], 1, "w-dash", 30, kinds=["add", "report"])
    await record_failure(store, retrying.id, claimed.attempt, "w-dash", "ValueError: once", delay=60)
    dead = await queue.enqueue("report", max_retries=0)
    [claimed] = await store.jobs.claim(["default"], 1, "w-dash", 30, kinds=["add", "report"])
    await record_failure(store, dead.id, claimed.attempt, "w-dash", "ValueError: for good")
    page = (await client.get(f"/ui/fragments/jobs/{retrying.id}")).text
    assert ">will retry</span>" in page and "<dt>Due</dt>" in page
    assert "1: 1 failed; retried on its own while fewer than 3 failed" in page
    page = (await client.get(f"/ui/fragments/jobs/{dead.id}")).text
    assert ">failed</span>" in page and "<dt>Due</dt>" not in page
    listed = (await client.get("/ui/fragments/jobs", params={"status": "failed"})).text
    assert listed.count(">will retry</span>") == 1 and listed.count(">failed</span>") == 1


async def test_the_job_lists_filters_come_from_its_url(client: httpx.AsyncClient) -> None:
    page = (await client.get("/ui/jobs", params={"status": "failed", "kind": "report", "queue": "mail"})).text
    assert '<option value="failed" selected>failed</option>' in page
    assert 'name="kind" type="text" size="16" value="report"' in page
    assert 'name="queue" type="text" size="12" value="mail"' in page
    plain = (await client.get("/ui/jobs", params={"status": "exploded"})).text  # ignored, not an error page
    assert " selected>" not in plain


async def test_the_job_list_finds_a_job_by_id_or_by_text_in_its_kind_name_or_payload(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    invoice = await queue.enqueue("send_invoice", {"customer": "Ada Lovelace", "total": 12})
    report = await queue.enqueue("report", {"month": "2026-11"}, name="November report")
    found = {
        term: (await client.get("/ui/fragments/jobs", params={"search": term})).text
        for term in ("lovelace", "INVOICE", "november", str(report.id), "100%_")
    }
    assert f'href="/ui/jobs/{invoice.id}"' in found["lovelace"] and f'href="/ui/jobs/{report.id}"' not in found["lovelace"]
    assert f'href="/ui/jobs/{invoice.id}"' in found["INVOICE"]
    assert f'href="/ui/jobs/{report.id}"' in found["november"] and f'href="/ui/jobs/{invoice.id}"' not in found["november"]
    assert f'href="/ui/jobs/{report.id}"' in found[str(report.id)]
    assert "No job matches." in found["100%_"]  # (text, not a LIKE pattern)
    over_http = (await client.get("/jobs", params={"search": "lovelace"})).json()
    assert [job["id"] for job in over_http["items"]] == [invoice.id]
    page = (await client.get("/ui/jobs", params={"search": "lovelace"})).text
    assert 'name="search" type="search" size="20" value="lovelace"' in page


async def test_the_runs_page_lists_run_history_filtered_from_its_url(
    client: httpx.AsyncClient, queue: Queue, store: Store
) -> None:
    ok = await queue.enqueue("add")
    bad = await queue.enqueue("report", max_retries=0)
    claimed = {job.id: job for job in await store.jobs.claim(["default"], 2, "w-dash", 30, kinds=["add", "report"])}
    await store.jobs.complete_succeeded([(ok.id, claimed[ok.id].attempt)], "w-dash")
    await record_failure(store, bad.id, claimed[bad.id].attempt, "w-dash", "ValueError: broke")
    every = (await client.get("/ui/fragments/runs")).text
    assert f'href="/ui/jobs/{ok.id}"' in every and f'href="/ui/jobs/{bad.id}"' in every
    failed = (await client.get("/ui/fragments/runs", params={"status": "failed"})).text
    assert f'href="/ui/jobs/{bad.id}"' in failed and f'href="/ui/jobs/{ok.id}"' not in failed
    assert "ValueError: broke" in failed
    one = (await client.get("/ui/fragments/runs", params={"job_id": str(ok.id)})).text
    assert f'href="/ui/jobs/{ok.id}"' in one and f'href="/ui/jobs/{bad.id}"' not in one
    assert (await client.get("/ui/fragments/runs", params={"status": "exploded"})).status_code == 400
    page = (await client.get("/ui/runs", params={"status": "failed", "job_id": "7"})).text
    assert '<option value="failed" selected>failed</option>' in page and 'value="7"' in page
    assert 'href="/ui/runs" aria-current="page"' in page


async def test_every_answer_forbids_framing_and_the_dashboard_allows_only_its_own_origin(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    job = await queue.enqueue("mail")
    for path in ("/", "/ui/jobs", f"/ui/jobs/{job.id}", f"/ui/fragments/jobs/{job.id}", "/ui/static/dashboard.js",
                 "/jobs", f"/jobs/{job.id}", "/health", "/metrics", "/schema/openapi.json", "/nowhere"):
        answer = await client.get(path)
        assert answer.headers["x-frame-options"] == "DENY", path
        assert answer.headers["x-content-type-options"] == "nosniff", path
        assert answer.headers["referrer-policy"] == "no-referrer", path
        policy = answer.headers["content-security-policy"]
        assert "frame-ancestors 'none'" in policy, path
        if path == "/" or path.startswith("/ui/"):
            assert "script-src 'self';" in policy and "style-src 'self';" in policy and "default-src 'none'" in policy
            assert "unsafe" not in policy
    page = (await client.get("/")).text
    assert '"allowEval": false' in page and '"includeIndicatorStyles": false' in page


async def test_a_missing_static_file_names_no_directory_and_dashboard_ids_follow_the_apis_rule(
    client: httpx.AsyncClient, queue: Queue
) -> None:
    for path in ("/ui/static/htmx/", "/ui/static/nothing.js", "/schema/static/x"):
        answer = await client.get(path)
        assert answer.status_code == 404 and answer.json()["detail"] == "no such file", (path, answer.text)
        assert "agora_pg" not in answer.text and "/static" not in answer.text
    jobs = [await queue.enqueue("mail") for _ in range(3)]
    assert f"<dd>{jobs[0].kind}</dd>" in (await client.get(f"/ui/fragments/jobs/{jobs[0].id}")).text
    for odd in ("٣", f"+{jobs[0].id}", f"0{jobs[0].id}"):  # as /jobs/٣ is a 404, the dashboard shows no job
        shown = (await client.get(f"/ui/fragments/jobs/{odd}")).text
        assert "No job" in shown and "<dt>Kind</dt>" not in shown, odd


async def test_jobs_of_a_kind_no_live_worker_handles_show_in_the_overview_metrics_and_jobs_list(
    client: httpx.AsyncClient, queue: Queue, store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from agora_pg.cli import main

    await store.workers.register("w-mail", "host", 1, ["default"], ["mail"])
    await store.workers.register("w-gone", "host", 2, ["default"], ["ecoh"])
    await store.workers.stop("w-gone")  # (a stopped worker handles nothing)
    typo = await queue.enqueue_many([JobSpec("ecoh"), JobSpec("ecoh")])
    mail = await queue.enqueue("mail")
    elsewhere = await queue.enqueue("mail", queue="reports")  # (no worker claims the queue)
    overview = (await client.get("/ui/fragments/overview")).text
    metrics = (await client.get("/metrics")).text
    assert "Waiting for a worker of their kind" in overview and "kind=ecoh&amp;queue=default" in overview, overview
    assert 'agora_jobs_unhandled{kind="ecoh",queue="default"} 2.0' in metrics, metrics
    assert 'agora_jobs_unhandled{kind="mail",queue="reports"} 1.0' in metrics, metrics
    assert 'agora_jobs_unhandled{kind="mail",queue="default"}' not in metrics
    monkeypatch.setenv("AGORA_PG_DATABASE_URL", database_url)
    assert await asyncio.to_thread(main, ["jobs", "list"]) == 0  # (the CLI runs an event loop of its own)
    rows = {int(line.split()[0]): line for line in capsys.readouterr().out.splitlines() if line[:1].isdigit()}
    for job in (*typo, elsewhere):
        assert "pending (no worker handles its kind)" in rows[job.id], rows
    assert "no worker" not in rows[mail.id]
