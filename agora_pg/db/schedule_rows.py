"""Values exchanged with the Store about schedules (rows in, rows out)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from agora_pg.job_spec import JobSpec


@dataclasses.dataclass(frozen=True)
class ScheduleRegistration:
    """What a worker registers for one pipeline."""

    pipeline_id: str
    kind: str
    spec: str
    first_run_at: datetime | None  # None: now, by the database clock
    error_backoff_seconds: float
    max_consecutive_errors: int
    new_launch: bool = False  # a once-per-launch schedule: due again now unless stopped or paused
    job_kind: str | None = None  # a periodic job: the kind each tick enqueues


@dataclasses.dataclass(frozen=True)
class NextTicks:
    """Seconds until a schedule falls due (``due_in``: one with no live run, the
    scheduler's next pass) and until a pipeline's next tick (``run_in``: its run's job,
    enqueued ahead, becomes claimable then); None: none."""

    due_in: float | None
    run_in: float | None


@dataclasses.dataclass(frozen=True)
class ScheduleRow:
    """One row of ``agora.schedules``; the ``*_seconds`` fields are measured by the database clock."""

    pipeline_id: str
    schedule_kind: str
    schedule_spec: str
    state: str
    next_run_at: datetime | None
    consecutive_errors: int
    last_error: str | None
    last_status: str | None
    last_started_at: datetime | None
    last_finished_at: datetime | None
    error_backoff_seconds: float
    max_consecutive_errors: int
    job_kind: str | None = None  # a periodic job's kind (None: a pipeline)
    job_id: int | None = None  # a pipeline's live run (its job, pending or running), if any
    lease_owner: str | None = None  # the worker running that job
    lease_expires_at: datetime | None = None  # until when that worker's lease holds
    due_in_seconds: float | None = None
    orphaned_since: datetime | None = None  # no live process has declared it since then

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> ScheduleRow:
        present = set(row.keys())
        values = {field.name: row[field.name] for field in dataclasses.fields(cls) if field.name in present}
        if values.get("due_in_seconds") is not None:
            values["due_in_seconds"] = float(values["due_in_seconds"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class DueTick:
    """A schedule whose next run is due, locked for this process until its transaction ends."""

    pipeline_id: str
    tick: datetime  # the time the run is due for
    database_now: datetime  # the database clock when it was found due


@dataclasses.dataclass(frozen=True)
class TickJob:
    """What one due tick becomes: a job, and the schedule's next run (None: never again,
    the schedule is completed). A pipeline's run (its ``run_plan``: the spec, the next run
    after a success, the launch) leaves the schedule as it is: the job's end sets the
    next one from its plan."""

    pipeline_id: str
    tick: datetime
    job: JobSpec
    next_run_at: datetime | None
    run_plan: dict[str, Any] | None = None

    @property
    def pipeline_run(self) -> bool:
        return self.run_plan is not None
