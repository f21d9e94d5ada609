"""The dashboard at ``/``: server-rendered pages that read the same tables the API does
and act only through the API's own routes.

Pages are empty shells anyone allowed to reach the server may load (they hold no data);
the fragments they fetch with htmx, and every action, go through the token guard like
the rest of the API (the page's script sends the token it keeps in the tab's
``sessionStorage``). Live updates come from ``GET /events``.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from urllib.parse import urlencode
from typing import Any

from litestar import Controller, Request, get
from litestar.datastructures import State
from litestar.plugins.jinja import JinjaTemplateEngine
from litestar.di import NamedDependency
from litestar.params import FromPath, FromQuery
from litestar.response import Template
from litestar.static_files import create_static_files_router
from litestar.template.config import TemplateConfig

from agora_pg.api import params
from agora_pg.api.auth import PUBLIC
from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.db.worker_table import WORKER_ALIVE_SECONDS
from agora_pg.errors import InvalidArgument, JobNotFound
from agora_pg.jobs import Job, JobStatus, RunStatus
from agora_pg.schedules import describe_spec

TEMPLATES = Path(__file__).parent / "templates"
STATIC = Path(__file__).parent / "static" / "dashboard"
TIMELINE_RUNS = 20
PAGE_SIZE = 50
STATUSES = tuple(status.value for status in JobStatus)
RUN_STATUSES = tuple(status.value for status in RunStatus)


def template_config() -> TemplateConfig[JinjaTemplateEngine]:
    return TemplateConfig(directory=TEMPLATES, engine=JinjaTemplateEngine)


def static_files() -> Any:
    """The dashboard's script, styles and vendored libraries (each with its licence)."""
    return create_static_files_router("/ui/static", directories=[STATIC], include_in_schema=False,
                                      opt={PUBLIC: True})


@dataclasses.dataclass(frozen=True)
class FilterField:
    """One field of a list page's filter form: a choice among ``choices``, or text."""

    name: str
    label: str
    value: str
    choices: tuple[str, ...] = ()
    type: str = "text"
    size: int = 14
    hint: str = ""


def _filled(value: str | None, choices: tuple[str, ...] = ()) -> str:
    """A filter's value from the page's URL (a choice it does not offer: none)."""
    text = (value or "")[:200]
    return text if not choices or text in choices else ""


def _page(page: str, heading: str, fragment: str, filters: list[FilterField] | None = None) -> Template:
    """A page shell; ``filters``: its list's filter form, filled from the page's URL (so
    that a filtered view can be bookmarked and shared)."""
    return Template("page.html", context={
        "page": page, "title": heading, "heading": heading, "fragment": fragment, "filters": filters,
    })


class DashboardPages(Controller):
    """The page shells (no data, no token needed)."""

    include_in_schema = False
    opt = {PUBLIC: True}

    @get("/")
    async def overview(self) -> Template:
        return _page("overview", "Overview", "/ui/fragments/overview")

    @get("/ui/jobs")
    async def jobs(self, status: FromQuery[str | None] = None, kind: FromQuery[str | None] = None,
                   queue: FromQuery[str | None] = None, search: FromQuery[str | None] = None) -> Template:
        return _page("jobs", "Jobs", "/ui/fragments/jobs", filters=[
            FilterField("status", "Status", _filled(status, STATUSES), STATUSES),
            FilterField("kind", "Kind", _filled(kind), size=16),
            FilterField("queue", "Queue", _filled(queue), size=12),
            FilterField("search", "Search", _filled(search), type="search", size=20,
                        hint="id, or text of kind, name, payload"),
        ])

    @get("/ui/runs")
    async def runs(self, status: FromQuery[str | None] = None, pipeline_id: FromQuery[str | None] = None,
                   job_id: FromQuery[str | None] = None) -> Template:
        return _page("runs", "Runs", "/ui/fragments/runs", filters=[
            FilterField("status", "Outcome", _filled(status, RUN_STATUSES), RUN_STATUSES),
            FilterField("pipeline_id", "Pipeline", _filled(pipeline_id), size=16),
            FilterField("job_id", "Job id", _filled(job_id), size=10),
        ])

    @get("/ui/jobs/{job_id:str}")
    async def job(self, job_id: FromPath[str]) -> Template:
        return _page("jobs", f"Job {job_id[:40]}", f"/ui/fragments/jobs/{params.plain_id(job_id) or 0}")

    @get("/ui/schedules")
    async def schedules(self) -> Template:
        return _page("schedules", "Schedules", "/ui/fragments/schedules")

    @get("/ui/dead-letters")
    async def dead_letters(self) -> Template:
        return _page("dead-letters", "Dead letters", "/ui/fragments/dead-letters")


class DashboardFragments(Controller):
    """The pages' contents, server-rendered from the database (behind the token guard)."""

    path = "/ui/fragments"
    include_in_schema = False

    @get("/overview")
    async def overview(self, store: NamedDependency[Store]) -> Template:
        queue_rows = await store.read_rows(queries.DASHBOARD_QUEUES)
        queues: dict[str, dict[str, Any]] = {}
        for row in queue_rows:
            entry = queues.setdefault(row["queue"], {"pending": 0, "processing": 0, "retrying": 0, "age": None})
            entry[row["state"]] = row["jobs"]
            if row["oldest_due_seconds"] is not None:
                entry["age"] = max(float(row["oldest_due_seconds"]), entry["age"] or 0.0)
        for entry in queues.values():
            entry["oldest"] = "none due" if entry["age"] is None else age_text(entry["age"])
        throughput = per_minute(await store.read_rows(queries.DASHBOARD_THROUGHPUT), time.time())
        schedules = await store.read_rows(queries.DASHBOARD_SCHEDULES)
        unhandled = await store.workers.unhandled_jobs()
        now = time.time()
        return Template("fragments/overview.html", context={
            "unhandled": [{**dataclasses.asdict(waiting), "age": age_text(max(0.0, now - waiting.since.timestamp()))}
                          for waiting in unhandled],
            "kind_conflicts": await store.workers.kind_conflicts(),
            "queues": queues,
            "throughput": throughput,
            "totals": {"succeeded": sum(throughput[1]), "failed": sum(throughput[2])},
            "workers": await store.read_rows(queries.DASHBOARD_WORKERS, WORKER_ALIVE_SECONDS),
            "alive_seconds": WORKER_ALIVE_SECONDS,
            "troubled": [row for row in schedules if row["in_trouble"]],
            "limits": await store.read_rows(queries.KIND_LIMITS_NOW),
            "queue_limits": await store.read_rows(queries.QUEUE_LIMITS_NOW),
        })

    @get("/jobs")
    async def jobs(
        self, store: NamedDependency[Store], status: FromQuery[str | None] = None, kind: FromQuery[str | None] = None,
        queue: FromQuery[str | None] = None, cursor: FromQuery[str | None] = None, search: FromQuery[str | None] = None,
    ) -> Template:
        if status and status not in STATUSES:
            raise InvalidArgument("status", f"must be one of {', '.join(STATUSES)}")
        filters = {
            "status": status or None,
            "kind": params.text_filter("kind", kind or None),
            "queue": params.text_filter("queue", queue or None),
            "search": params.text_filter("search", (search or "").strip() or None),
            "before_id": params.cursor_id(cursor or None),
        }
        jobs = await store.jobs.search(filters, PAGE_SIZE)
        next_cursor = params.next_cursor([job.id for job in jobs], PAGE_SIZE)
        bulk = {name: value for name, value in filters.items() if value is not None and name != "before_id"}
        return Template("fragments/jobs.html", context={
            "jobs": jobs, "next_cursor": next_cursor, "more": f"/ui/fragments/jobs?cursor={next_cursor}",
            "state_of": state_text, "bulk_query": urlencode(bulk),
        })

    @get("/runs")
    async def runs(
        self, store: NamedDependency[Store], status: FromQuery[str | None] = None,
        pipeline_id: FromQuery[str | None] = None, job_id: FromQuery[str | None] = None,
        cursor: FromQuery[str | None] = None,
    ) -> Template:
        if status and status not in RUN_STATUSES:
            raise InvalidArgument("status", f"must be one of {', '.join(RUN_STATUSES)}")
        filters = {
            "pipeline_id": params.text_filter("pipeline_id", pipeline_id or None),
            "job_id": params.job_id_filter(job_id or None),
            "status": status or None,
            "before_id": params.cursor_id(cursor or None),
        }
        runs = await store.runs.search(filters, PAGE_SIZE)
        next_cursor = params.next_cursor([run.id for run in runs], PAGE_SIZE)
        return Template("fragments/runs.html", context={
            "runs": runs, "next_cursor": next_cursor, "more": f"/ui/fragments/runs?cursor={next_cursor}",
        })

    @get("/jobs/{job_id:str}")
    async def job(self, store: NamedDependency[Store], job_id: FromPath[str]) -> Template:
        plain = params.plain_id(job_id)  # the API's rule: plain ASCII digits (not "٣", "+3" or "03")
        if plain is None:
            return Template("fragments/job.html", context={"job": None, "job_id": job_id[:40]})
        try:
            job = await store.jobs.get(plain)
        except JobNotFound:
            return Template("fragments/job.html", context={"job": None, "job_id": plain})
        runs = await store.runs.of_job(plain)
        results = [run.result for run in runs if run.status == "succeeded"]
        return Template("fragments/job.html", context={
            "job": job, "runs": runs, "payload": json.dumps(job.payload, indent=2, ensure_ascii=False),
            "state": state_text(job),
            "result": json.dumps(results[-1], indent=2, ensure_ascii=False) if results else None,
        })

    @get("/schedules")
    async def schedules(self, store: NamedDependency[Store]) -> Template:
        schedules = await store.read_rows(queries.DASHBOARD_SCHEDULES)
        for schedule in schedules:
            schedule["words"] = describe_spec(schedule["schedule"])
        runs = await store.read_rows(queries.DASHBOARD_PIPELINE_RUNS, TIMELINE_RUNS)
        return Template("fragments/schedules.html", context={
            "schedules": schedules, "runs_by_pipeline": timelines(runs),
        })

    @get("/dead-letters")
    async def dead_letters(self, request: Request[Any, Any, State], store: NamedDependency[Store]) -> Template:
        letters = await store.read_rows(queries.DASHBOARD_DEAD_LETTERS, 100)
        pipelines = sorted({letter["pipeline_id"] for letter in letters})
        return Template("fragments/dead_letters.html", context={
            "letters": letters, "pipelines": pipelines, "replayable": set(request.app.state.pipelines),
        })


def state_text(job: Job) -> str:
    """A job's status as the dashboard says it: a failed job that will be retried on its
    own is "will retry", one that will not is "failed"."""
    if job.status is JobStatus.FAILED and not job.is_finished:
        return "will retry"
    return job.status.value


def age_text(seconds: float) -> str:
    """``42 s``, ``5 min``, ``3 h``, ``2 d``."""
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def per_minute(rows: list[dict[str, Any]], now: float) -> list[list[int]]:
    """The last 60 minutes as uPlot data: [minute starts], [succeeded], [failed], zeros
    where nothing finished."""
    last = int(now // 60 * 60)
    minutes = list(range(last - 59 * 60, last + 60, 60))
    counts = {int(row["minute"]): (int(row["succeeded"]), int(row["failed"])) for row in rows}
    return [minutes, [counts.get(m, (0, 0))[0] for m in minutes], [counts.get(m, (0, 0))[1] for m in minutes]]


def timelines(runs: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Each pipeline's recent runs, each with its bar's width (% of the longest)."""
    by_pipeline: dict[str, list[dict[str, Any]]] = {}
    for run in runs:
        by_pipeline.setdefault(run["pipeline_id"], []).append(run)
    for pipeline_runs in by_pipeline.values():
        longest = max(float(run["seconds"]) for run in pipeline_runs) or 1.0
        for run in pipeline_runs:
            run["seconds"] = float(run["seconds"])
            run["width"] = max(2.0, 100.0 * run["seconds"] / longest)
    return by_pipeline
