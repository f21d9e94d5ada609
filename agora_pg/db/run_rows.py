"""Runs as rows: one attempt of a job, or one tick of a scheduled pipeline."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from agora_pg.db.job_rows import UnhandledJobs
from agora_pg.limits import QueueLimit


@dataclasses.dataclass(frozen=True)
class RunRow:
    """One row of ``agora.runs`` (``queries.RUN_COLUMNS``)."""

    id: int
    job_id: int | None
    pipeline_id: str | None
    attempt: int
    worker_id: str | None
    started_at: datetime
    finished_at: datetime | None
    status: str
    error_type: str | None
    error_message: str | None
    scheduled_for: datetime | None
    traceback: str | None = None
    progress: dict[str, Any] | None = None
    result: Any = None  # a succeeded attempt's result (what its handler returned), decoded

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRow:
        fields = {field.name: row[field.name] for field in dataclasses.fields(cls)}
        if fields["progress"] is not None:
            fields["progress"] = json.loads(fields["progress"])
        if fields["result"] is not None:
            fields["result"] = json.loads(fields["result"])
        return cls(**fields)


@dataclasses.dataclass(frozen=True)
class MetricsSnapshot:
    """What ``/metrics`` reports, read in one go."""

    live_jobs: list[tuple[str, str, int]]  # queue, state (pending, processing, retrying), count
    oldest_due_seconds: dict[str, float]  # queue -> age of its oldest due job (pending or retrying)
    schedules: dict[str, int]  # state -> count
    schedules_in_backoff: int
    kind_limits: list[KindLimitNow] = dataclasses.field(default_factory=list)
    tallies: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # agora.process_tallies' snapshots
    queue_limits: dict[str, QueueLimit] = dataclasses.field(default_factory=dict)  # queue -> its limits
    unhandled: list[UnhandledJobs] = dataclasses.field(default_factory=list)  # jobs no live worker handles
    schedules_orphaned: int = 0  # schedules no live process declares


@dataclasses.dataclass(frozen=True)
class KindLimitNow:
    """A kind under flow control now (``queries.KIND_LIMITS_NOW``): its limits (per key of
    ``limit_by``), the field it is shared by, its running jobs, its keys at a limit, its
    due jobs waiting and how many keys of fair share they have; ``declared_in``: ``code``
    or ``config`` (an agora/v1 ``[kinds]`` table)."""

    kind: str
    concurrency: int | None
    limit_by: str | None
    rate: int | None
    rate_seconds: float | None
    fair_by: str | None
    running: int
    full_keys: int
    waiting: int
    waiting_keys: int
    declared_in: str


def oldest_due_by_queue(ages: Iterable[tuple[str, Any]]) -> dict[str, float]:
    """The oldest due job's age per queue, from (queue, age) pairs of several states."""
    oldest: dict[str, float] = {}
    for queue, age in ages:
        oldest[queue] = max(float(age), oldest.get(queue, 0.0))
    return oldest
