"""Jobs as values: statuses and the ``Job`` record.

Pure: no I/O. Which columns go with which status is the database's to enforce: the
CHECK constraints of ``agora.jobs`` (migration 0012) refuse an impossible row.
"""

from __future__ import annotations

import dataclasses
import enum
from datetime import datetime
from typing import Any


MAX_JOB_ID = 2**63 - 1  # ids are bigint: a larger number names no job (and the driver refuses it)


def possible_job_id(job_id: int) -> bool:
    """True if some job could have this id."""
    return 1 <= job_id <= MAX_JOB_ID


class JobStatus(str, enum.Enum):
    """Where a job is in its life. ``failed`` is terminal only once
    ``retry_count`` has reached ``max_retries``; before that it waits for its
    next attempt at ``run_at``."""

    PENDING = "pending"
    PROCESSING = "processing"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunStatus(str, enum.Enum):
    """How one execution attempt (a row of ``agora.runs``) ended."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    ABANDONED = "abandoned"  # the lease was lost (worker gone, or cut off from the database)
    CANCELLED = "cancelled"  # cancelled on request, or cut short at shutdown


def will_retry(retry_count: int, max_retries: int) -> bool:
    """Whether a failed job with this many failures is claimed again.

    ``retry_count`` counts failed attempts; a job whose count has reached
    ``max_retries`` is never claimed again (so ``max_retries=3`` allows three
    failed attempts, and 0 or 1 mean a single attempt).
    """
    return retry_count < max_retries


@dataclasses.dataclass(frozen=True)
class Job:
    """One row of ``agora.jobs``, as handlers and callers see it."""

    id: int
    name: str
    kind: str
    queue: str
    status: JobStatus
    payload: Any  # a JSON object (dict); in the handler of a typed kind, an instance of its payload type
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
    lost_count: int = 0
    timeout_seconds: float | None = None
    cancel_requested_at: datetime | None = None
    progress: dict[str, Any] | None = None  # the latest attempt's last progress report

    @classmethod
    def from_fields(cls, fields: dict[str, Any]) -> Job:
        """A job from a dict holding exactly its fields (which it takes over).

        Skips the frozen dataclass ``__init__``, which sets each of the 21 fields
        through ``object.__setattr__``: 3.2 us against 0.4 us a job, and a worker
        claiming 30,000 jobs a second, or a 5,000-job enqueue, builds one per job.
        """
        job = object.__new__(cls)
        object.__setattr__(job, "__dict__", fields)
        return job

    @property
    def is_finished(self) -> bool:
        """True once the job will never run again on its own."""
        if self.status in (JobStatus.DONE, JobStatus.CANCELLED):
            return True
        if self.status is JobStatus.FAILED:
            return self.max_retries is not None and not will_retry(self.retry_count, self.max_retries)
        return False


# The job's fields, in order: the columns every job statement returns (queries.JOB_COLUMNS)
# and the fields of the API's JobOut are derived from this one declaration.
JOB_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(Job))
