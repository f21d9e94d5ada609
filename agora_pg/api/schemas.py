"""Request and response bodies of the API (msgspec structs, separate from table rows)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

import msgspec

from agora_pg.db.run_rows import RunRow
from agora_pg.db.schedule_rows import ScheduleRow
from agora_pg.job_spec import MAX_TIMEOUT_SECONDS
from agora_pg.jobs import JOB_FIELDS, Job, JobStatus, RunStatus

Text = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]
AwareDatetime = Annotated[datetime, msgspec.Meta(tz=True)]


class JobCreate(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """A job to enqueue. ``name`` defaults to ``kind``; ``queue`` to the kind's (when the
    API knows the kinds: ``agora-pg api --module``), else ``default``; ``run_at`` to now;
    ``max_retries`` to the kind's, else the API process's ``WORKER_MAX_RETRIES``;
    ``timeout_seconds`` (how long an attempt may run) to the kind's timeout, else the
    worker's ``WORKER_JOB_TIMEOUT``. A kind with a declared payload type has its payload
    checked against it."""

    kind: Text
    name: Text | None = None
    payload: dict[str, Any] = msgspec.field(default_factory=dict)
    queue: Text | None = None
    priority: Annotated[int, msgspec.Meta(ge=-(2**31 - 1), le=2**31 - 1)] = 0
    run_at: AwareDatetime | None = None
    max_retries: Annotated[int, msgspec.Meta(ge=0, le=2**31 - 1)] | None = None
    dedup_key: Text | None = None
    timeout_seconds: Annotated[float, msgspec.Meta(gt=0, le=MAX_TIMEOUT_SECONDS)] | None = None


class RunOut(msgspec.Struct, kw_only=True):
    """One attempt of a job, or one tick of a scheduled pipeline."""

    id: int
    job_id: int | None
    pipeline_id: str | None
    attempt: int
    worker_id: str | None
    status: RunStatus
    started_at: datetime
    finished_at: datetime | None
    scheduled_for: datetime | None
    error_type: str | None
    error_message: str | None
    traceback: str | None = None
    progress: dict[str, Any] | None = None
    result: Any = None

    @classmethod
    def of(cls, run: RunRow) -> RunOut:
        return cls(
            id=run.id, job_id=run.job_id, pipeline_id=run.pipeline_id, attempt=run.attempt,
            worker_id=run.worker_id, status=RunStatus(run.status), started_at=run.started_at,
            finished_at=run.finished_at, scheduled_for=run.scheduled_for, error_type=run.error_type,
            error_message=run.error_message, traceback=run.traceback, progress=run.progress,
            result=run.result,
        )


class JobOut(msgspec.Struct, kw_only=True):
    """A job as stored; ``runs`` and ``result`` (what the handler of its succeeded attempt
    returned) are filled only by ``GET /jobs/{id}``. ``retry_count``
    counts failed attempts, ``lost_count`` attempts lost with their worker or cut short
    at shutdown; ``cancel_requested_at`` is set while a running job is being cancelled."""

    id: int
    name: str
    kind: str
    queue: str
    status: JobStatus
    payload: dict[str, Any]
    priority: int
    run_at: datetime
    retry_count: int
    max_retries: int | None
    error_message: str | None
    dedup_key: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    locked_by: str | None
    lease_expires_at: datetime | None
    attempt: int
    lost_count: int
    timeout_seconds: float | None
    cancel_requested_at: datetime | None
    progress: dict[str, Any] | None = None
    result: Any = None
    runs: list[RunOut] | None = None
    # POST /jobs only: why the job may wait for ever (no live worker handles its kind)
    warning: str | None = None

    @classmethod
    def of(cls, job: Job, runs: list[RunRow] | None = None) -> JobOut:
        return cls(
            **{name: getattr(job, name) for name in JOB_FIELDS},
            result=next((run.result for run in runs or () if run.status == "succeeded"), None),
            runs=None if runs is None else [RunOut.of(run) for run in runs],
        )


class JobPage(msgspec.Struct):
    """One page of jobs, newest first; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[JobOut]
    next_cursor: str | None


class RunPage(msgspec.Struct):
    """One page of runs, newest first; pass ``next_cursor`` as ``cursor`` for the next."""

    items: list[RunOut]
    next_cursor: str | None


class ScheduleOut(msgspec.Struct, kw_only=True):
    """A scheduled pipeline's durable state; ``job_kind`` is set for a periodic job (the
    kind each tick enqueues)."""

    pipeline_id: str
    schedule_kind: str
    schedule_spec: str
    state: str
    running: bool
    next_run_at: datetime | None
    consecutive_errors: int
    last_error: str | None
    last_status: str | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    lease_owner: str | None
    lease_expires_at: datetime | None
    error_backoff_seconds: float
    max_consecutive_errors: int
    job_kind: str | None = None
    # no live process has declared the schedule since then (its code is gone, or its
    # workers are down): delete it with DELETE /schedules/{pipeline_id}
    orphaned_since: datetime | None = None

    @classmethod
    def of(cls, row: ScheduleRow) -> ScheduleOut:
        return cls(
            pipeline_id=row.pipeline_id, schedule_kind=row.schedule_kind, schedule_spec=row.schedule_spec,
            state=row.state, running=row.lease_owner is not None, next_run_at=row.next_run_at,
            consecutive_errors=row.consecutive_errors, last_error=row.last_error, last_status=row.last_status,
            last_started_at=row.last_started_at, last_finished_at=row.last_finished_at,
            lease_owner=row.lease_owner, lease_expires_at=row.lease_expires_at,
            error_backoff_seconds=row.error_backoff_seconds, max_consecutive_errors=row.max_consecutive_errors,
            job_kind=row.job_kind, orphaned_since=row.orphaned_since,
        )


class ErrorBody(msgspec.Struct):
    """Every 4xx and 5xx answer: ``field`` names the bad input where there is one."""

    status_code: int
    detail: str
    field: str | None = None


class Health(msgspec.Struct):
    status: str
    detail: str | None = None
    revision: str | None = None
