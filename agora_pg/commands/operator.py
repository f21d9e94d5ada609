"""``agora-pg jobs ...``, ``agora-pg schedules ...`` and ``agora-pg runs list``: the database,
straight from a shell."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

from agora_pg.commands.tables import render_table
from agora_pg.db.connect import resolve_database
from agora_pg.db.run_rows import RunRow
from agora_pg.db.schedule_rows import ScheduleRow
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, ConfigError, InvalidArgument, JobNotFound, ScheduleNotFound
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus, RunStatus, possible_job_id
from agora_pg.retention import Retention, parse_age
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.handlers import apply_kinds

JOB_HEADERS = ("id", "kind", "queue", "status", "retries", "run_at", "finished_at", "error")
SCHEDULE_HEADERS = ("pipeline_id", "schedule", "enqueues", "state", "next_run_at", "errors", "last_status",
                    "last_error", "orphaned_since")
RUN_HEADERS = ("id", "job_id", "pipeline_id", "attempt", "status", "started_at", "finished_at", "worker", "error")


@contextlib.asynccontextmanager
async def operator_store(pool_size: int = 1) -> AsyncIterator[tuple[Store, Settings]]:
    settings = load_settings(os.environ)
    async with resolve_database(settings) as database:
        store = Store.open(database, pool_size=pool_size)
        try:
            yield store, settings
        finally:
            await store.close()


def job_row(job: Job, unhandled: frozenset[tuple[str, str]] = frozenset()) -> tuple[object, ...]:
    """A job's row; a claimable one of a (queue, kind) in ``unhandled`` says that it waits for a worker."""
    retries = f"{job.retry_count}/{job.max_retries if job.max_retries is not None else '-'}"
    status = job.status.value
    if (job.queue, job.kind) in unhandled and job.status is not JobStatus.PROCESSING and not job.is_finished:
        status += " (no worker handles its kind)"
    elif job.status is JobStatus.PROCESSING and job.cancel_requested_at is not None:
        status += " (cancel asked: its worker stops it)"
    return (job.id, job.kind, job.queue, status, retries, job.run_at, job.finished_at, job.error_message)


def run_row(run: RunRow) -> tuple[object, ...]:
    return (run.id, run.job_id, run.pipeline_id, run.attempt, run.status, run.started_at, run.finished_at,
            run.worker_id, run.error_message)


def schedule_row(row: ScheduleRow) -> tuple[object, ...]:
    return (row.pipeline_id, row.schedule_spec, row.job_kind or "", row.state, row.next_run_at,
            row.consecutive_errors, row.last_status, row.last_error, row.orphaned_since)


def parse_payload(text: str) -> dict[str, Any]:
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as error:
        raise InvalidArgument("--payload", f"not JSON: {error}") from None
    if not isinstance(payload, dict):
        raise InvalidArgument("--payload", f"expected a JSON object, got {type(payload).__name__}")
    return payload


def parse_time(option: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(
            option, f"expected an ISO 8601 time such as 2026-01-01T09:00:00+00:00, got {text!r}"
        ) from None
    if value.tzinfo is None:
        raise InvalidArgument(option, f"expected a time with a UTC offset (add +00:00 or Z), got {text!r}")
    return value


def parse_choice(option: str, text: str | None, choices: type[JobStatus] | type[RunStatus]) -> str | None:
    if text is None:
        return None
    allowed = [member.value for member in choices]
    if text not in allowed:
        raise InvalidArgument(option, f"expected one of {', '.join(allowed)}, got {text!r}")
    return text


async def submit(kind: str, payload: str, queue: str | None, priority: int, run_at: str | None, max_retries: int | None,
                 dedup_key: str | None, name: str | None, timeout: float | None = None) -> str:
    spec = JobSpec(kind=kind, payload=parse_payload(payload), name=name, queue=queue, priority=priority,
                   run_at=parse_time("--run-at", run_at), max_retries=max_retries, dedup_key=dedup_key,
                   timeout_seconds=timeout)
    async with operator_store() as (store, settings):
        [(job, created)] = await store.jobs.enqueue(apply_kinds({}, [spec]))
    note = "" if created else f"\n(a live job with dedup key {dedup_key!r} already existed)"
    return render_table(JOB_HEADERS, [job_row(job)]) + note


async def list_jobs(status: str | None, kind: str | None, queue: str | None, limit: int) -> str:
    filters = {"status": parse_choice("--status", status, JobStatus), "kind": kind, "queue": queue}
    async with operator_store() as (store, _settings):
        jobs = await store.jobs.search(filters, _limit(limit))
        unhandled = frozenset((waiting.queue, waiting.kind) for waiting in await store.workers.unhandled_jobs())
    return render_table(JOB_HEADERS, [job_row(job, unhandled) for job in jobs])


async def show_job(job_id: int) -> str:
    async with operator_store() as (store, _settings):
        job = await store.jobs.get(job_id)
        runs = await store.runs.of_job(job_id)
    details = [
        ("id", job.id), ("name", job.name), ("kind", job.kind), ("queue", job.queue), ("status", job.status.value),
        ("priority", job.priority), ("run_at", job.run_at), ("retry_count", job.retry_count),
        ("max_retries", job.max_retries), ("lost_count", job.lost_count), ("timeout_seconds", job.timeout_seconds),
        ("dedup_key", job.dedup_key), ("created_at", job.created_at),
        ("started_at", job.started_at), ("finished_at", job.finished_at), ("locked_by", job.locked_by),
        ("cancel_requested_at", job.cancel_requested_at),
        ("error_message", job.error_message), ("payload", json.dumps(job.payload)),
    ]
    width = max(len(key) for key, _ in details)
    lines = [f"{key.ljust(width)}  {value if value is not None else '-'}" for key, value in details]
    table = render_table(RUN_HEADERS, [run_row(run) for run in runs])
    return "\n".join(lines) + "\n\nruns:\n" + table + tracebacks(runs)


def tracebacks(runs: list[RunRow]) -> str:
    """The stored tracebacks of ``runs``, each under a heading, after a blank line."""
    parts = [f"\ntraceback of run {run.id} (attempt {run.attempt}):\n{run.traceback.rstrip()}"
             for run in runs if run.traceback]
    return "\n" + "\n".join(parts) if parts else ""


async def retry_job(job_id: int) -> str:
    async with operator_store() as (store, _settings):
        job = await store.jobs.retry(job_id)
    return render_table(JOB_HEADERS, [job_row(job)])


async def cancel_job(job_id: int) -> str:
    async with operator_store() as (store, _settings):
        job = await store.jobs.cancel(job_id)
    return render_table(JOB_HEADERS, [job_row(job)])


async def list_runs(pipeline_id: str | None, job_id: int | None, status: str | None, since: str | None,
                    until: str | None, limit: int, with_tracebacks: bool = False) -> str:
    if job_id is not None and not possible_job_id(job_id):
        raise JobNotFound(job_id)  # (a filter, but the driver would refuse the number)
    filters = {
        "pipeline_id": pipeline_id, "job_id": job_id, "status": parse_choice("--status", status, RunStatus),
        "since": parse_time("--since", since), "until": parse_time("--until", until),
    }
    async with operator_store() as (store, _settings):
        runs = await store.runs.search(filters, _limit(limit))
    table = render_table(RUN_HEADERS, [run_row(run) for run in runs])
    return table + (tracebacks(runs) if with_tracebacks else "")


async def list_schedules() -> str:
    async with operator_store() as (store, _settings):
        rows = await store.schedules.all()
    return render_table(SCHEDULE_HEADERS, [schedule_row(row) for row in rows])


async def change_schedule(action: str, pipeline_id: str) -> str:
    """``show``, ``pause``, ``resume``, ``trigger`` or ``delete`` one schedule (as the HTTP API does)."""
    async with operator_store() as (store, _settings):
        if action == "delete":
            deleted, cancelled = await store.schedules.delete(pipeline_id)
            return (render_table(SCHEDULE_HEADERS, [schedule_row(deleted)])
                    + f"\ndeleted, with {cancelled} job(s) of its future ticks cancelled; its runs stay")
        if action == "show":
            row = await store.schedules.get(pipeline_id)
            if row is None:
                raise ScheduleNotFound(pipeline_id)
        else:
            change = {"pause": store.schedules.pause, "resume": store.schedules.resume,
                      "trigger": store.schedules.trigger}[action]
            row = await change(pipeline_id)
    return render_table(SCHEDULE_HEADERS, [schedule_row(row)])


def _limit(limit: int) -> int:
    if not 1 <= limit <= 10_000:
        raise InvalidArgument("--limit", f"must be between 1 and 10000, got {limit}")
    return limit


async def prune(older_than: str, keep_failed: str | None, batch_size: int) -> str:
    """``agora-pg prune``: what it deleted, or that another process is pruning."""
    if batch_size < 1:
        raise ConfigError("--batch-size", f"must be >= 1, got {batch_size}")
    finished = parse_age(older_than, "--older-than")
    retention = Retention(finished, parse_age(keep_failed, "--keep-failed") if keep_failed else finished)
    async with operator_store() as (store, _settings):
        report = await store.prune(retention, batch_size)
    if report.busy:
        raise AgoraError("another process is pruning now (a worker, or another agora-pg prune); try again later")
    return (f"pruned {report.jobs} jobs with their runs, {report.pipeline_runs} pipeline runs, "
            f"{report.dead_letters} dead letters")
