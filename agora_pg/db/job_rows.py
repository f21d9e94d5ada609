"""Jobs as rows: building ``Job`` values from what the job statements return."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus

_STATUSES = {status.value: status for status in JobStatus}


def inserted_job(row: Mapping[str, Any], spec: JobSpec) -> Job:
    """The ``Job`` a spec became, from the ``queries.INSERTED_COLUMNS`` of its row."""
    return Job(
        id=row["id"],
        name=spec.name if spec.name is not None else spec.kind,
        kind=spec.kind,
        queue=spec.queue,
        status=JobStatus.PENDING,
        payload=spec.payload,
        priority=spec.priority,
        run_at=row["run_at"],
        retry_count=0,
        max_retries=spec.max_retries,
        error_message=None,
        dedup_key=spec.dedup_key,
        created_at=row["created_at"],
        started_at=None,
        finished_at=None,
        locked_by=None,
        lease_expires_at=None,
        attempt=0,
    )


def row_to_job(row: Mapping[str, Any]) -> Job:
    """Build a ``Job`` from a row selected with ``queries.JOB_COLUMNS``."""
    return Job(
        id=row["id"],
        name=row["name"],
        kind=row["kind"],
        queue=row["queue"],
        status=_STATUSES[row["status"]],
        payload=json.loads(row["payload"]),
        priority=row["priority"],
        run_at=row["run_at"],
        retry_count=row["retry_count"],
        max_retries=row["max_retries"],
        error_message=row["error_message"],
        dedup_key=row["dedup_key"],
        created_at=row["created_at"],
        started_at=row["started_at"],
        finished_at=row["finished_at"],
        locked_by=row["locked_by"],
        lease_expires_at=row["lease_expires_at"],
        attempt=row["attempt"],
    )
