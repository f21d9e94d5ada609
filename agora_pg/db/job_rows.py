"""Jobs as rows: building ``Job`` values from what the job statements return."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agora_pg.job_spec import JobSpec
from agora_pg.jobs import JOB_FIELDS, Job, JobStatus

_STATUSES = {status.value: status for status in JobStatus}


def inserted_job(row: Mapping[str, Any], spec: JobSpec) -> Job:
    """The ``Job`` a spec became, from the ``queries.INSERTED_COLUMNS`` of its row."""
    return new_job(spec, row["id"], row["created_at"], row["run_at"], row["queue"], row["max_retries"],
                   row["timeout_seconds"])


def new_job(
    spec: JobSpec, job_id: int, created_at: datetime, run_at: datetime, queue: str, max_retries: int | None,
    timeout_seconds: float | None,
) -> Job:
    """The ``Job`` a spec became, given what the database chose for it (its kind's options among them)."""
    fields = dict(_NEW_JOB)
    fields.update(
        id=job_id, name=spec.name if spec.name is not None else spec.kind, kind=spec.kind, queue=queue,
        payload=spec.payload, priority=spec.priority, run_at=run_at, max_retries=max_retries,
        dedup_key=spec.dedup_key, created_at=created_at, timeout_seconds=timeout_seconds,
    )
    return Job.from_fields(fields)


# A job as its insert leaves it, before what the spec and the database give it.
_NEW_JOB: dict[str, Any] = {**dict.fromkeys(JOB_FIELDS), "status": JobStatus.PENDING, "retry_count": 0,
                            "attempt": 0, "lost_count": 0}


def row_to_job(row: Mapping[str, Any]) -> Job:
    """Build a ``Job`` from a row selected with ``queries.JOB_COLUMNS``."""
    fields = dict(row.items())  # (for an asyncpg Record, 15 % faster than dict(row))
    fields["status"] = _STATUSES[fields["status"]]
    # asyncpg hands jsonb over as text; psycopg (the synchronous enqueue) decoded already
    if isinstance(fields["payload"], str):
        fields["payload"] = json.loads(fields["payload"])
    if isinstance(fields["progress"], str):
        fields["progress"] = json.loads(fields["progress"])
    return Job.from_fields(fields)


@dataclasses.dataclass(frozen=True)
class JobFinish:
    """One outcome other than success, as ``queries.FINISH_JOBS`` takes it: ``kind`` is an
    ``outcomes.OutcomeKind`` value; ``delay_seconds`` the wait before a failed job's retry."""

    job_id: int
    attempt: int
    kind: str
    error_type: str | None
    error_message: str | None
    traceback: str | None
    delay_seconds: float
    final: bool


@dataclasses.dataclass(frozen=True)
class UnhandledJobs:
    """Claimable jobs of one queue and kind that no live worker handles: they wait for
    one (``queries.UNHANDLED_JOBS``). ``since``: the oldest one's due time."""

    queue: str
    kind: str
    jobs: int
    since: datetime


@dataclasses.dataclass(frozen=True)
class DeclaredKind:
    """The options of a kind a worker declares in ``agora.kinds`` (None: none)."""

    queue: str | None = None
    max_retries: int | None = None
    timeout_seconds: float | None = None
    retry_backoff_seconds: float | None = None

    def __str__(self) -> str:
        shown = [f"{name}={value:g}" if isinstance(value, float) else f"{name}={value}"
                 for name, value in dataclasses.asdict(self).items() if value is not None]
        return " ".join(shown) or "no options"


@dataclasses.dataclass(frozen=True)
class KindConflict:
    """A live worker (``worker_id``) declared other options for ``kind`` than the ones
    ``agora.kinds`` holds, which ``declared_by`` declared later and which apply."""

    kind: str
    worker_id: str
    declares: DeclaredKind
    holds: DeclaredKind
    declared_by: str

    @classmethod
    def from_row(cls, row: Any) -> KindConflict:
        return cls(row["kind"], row["worker_id"], DeclaredKind(**json.loads(row["declares"])),
                   DeclaredKind(**json.loads(row["holds"])), row["declared_by"])


@dataclasses.dataclass(frozen=True)
class LeaseRenewal:
    """What a renewal found: leases no longer held (job ``(id, attempt)`` pairs), the job attempts whose cancel was asked for, the jobs held in the worker's name
    that it did not list (a claim whose reply was lost), and whether the worker's row was
    there to renew (its worker lease covers its jobs only then)."""

    lost_jobs: frozenset[tuple[int, int]]
    cancel_jobs: frozenset[tuple[int, int]]
    unknown_jobs: frozenset[int] = frozenset()
    worker_renewed: bool = False


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What a promotion of due delayed jobs did: how many it promoted, and the seconds
    until the next delayed job falls due (None: no job waits), by the database's clock."""

    promoted: int
    next_in_seconds: float | None


