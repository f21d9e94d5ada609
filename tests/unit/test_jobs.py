import dataclasses
from datetime import UTC, datetime

import pytest

from agora_pg.jobs import JOB_FIELDS, Job, JobStatus, will_retry


def make_job(status: JobStatus, retry_count: int = 0, max_retries: int | None = 3) -> Job:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return Job(
        id=1, name="n", kind="k", queue="default", status=status, payload={}, priority=0, run_at=now,
        retry_count=retry_count, max_retries=max_retries, error_message=None, dedup_key=None,
        created_at=now, started_at=None, finished_at=None, locked_by=None, lease_expires_at=None, attempt=0,
    )


def test_from_fields_equals_the_dataclass_constructor() -> None:
    job = make_job(JobStatus.FAILED, retry_count=1)
    rebuilt = Job.from_fields(dict(vars(job)))
    assert rebuilt == job and repr(rebuilt) == repr(job)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rebuilt.attempt = 5  # type: ignore[misc]


@pytest.mark.parametrize(("retry_count", "max_retries", "expected"), [(0, 3, True), (2, 3, True), (3, 3, False), (0, 0, False)])
def test_will_retry_until_retry_count_reaches_max(retry_count: int, max_retries: int, expected: bool) -> None:
    assert will_retry(retry_count, max_retries) is expected


def test_is_finished() -> None:
    assert make_job(JobStatus.DONE).is_finished
    assert make_job(JobStatus.CANCELLED).is_finished
    assert make_job(JobStatus.FAILED, retry_count=3, max_retries=3).is_finished
    assert not make_job(JobStatus.FAILED, retry_count=1, max_retries=3).is_finished
    assert not make_job(JobStatus.PENDING).is_finished
    assert not make_job(JobStatus.PROCESSING).is_finished


def test_the_job_is_declared_once_and_its_row_and_api_body_carry_every_field() -> None:
    from agora_pg.api.schemas import JobOut
    from agora_pg.db import queries

    assert JOB_FIELDS[:3] == ("id", "name", "kind") and len(JOB_FIELDS) == len(set(JOB_FIELDS))
    # the API adds what a GET finds, and what a POST warns of
    assert JobOut.__struct_fields__ == (*JOB_FIELDS, "result", "runs", "warning")
    assert [part.split(" AS ")[-1].strip() for part in queries.JOB_COLUMNS.split(",")] == list(JOB_FIELDS)
