"""Periodic jobs: a schedule that enqueues one job of a kind per tick, across all workers.

A ``PeriodicJob`` is a schedule row of ``agora.schedules`` that the process's
``Scheduler`` turns into one ordinary job per tick (the job's dedup key names the
tick, and the schedule row is advanced in the same transaction, so N processes never
enqueue a tick twice); from then on the job is the job engine's, like any other. Its
pause, resume and trigger are those of any schedule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agora_pg.db.schedule_rows import DueTick, TickJob
from agora_pg.job_spec import JobSpec
from agora_pg.schedules import TICK_FIELD, Schedule, ScheduleKind, Scheduled


class PeriodicJob(Scheduled):
    """Enqueue a job of ``kind`` on ``schedule``, once per tick across all workers, with
    the tick's time in ``payload["scheduled_for"]``.

    >>> pool.register(PeriodicJob("send_report", Schedule.cron("0 8 * * 1-5", "Europe/Berlin"),
    ...                           payload={"to": "team@example.com"}))

    ``pipeline_id`` (default ``periodic:<kind>``) names the schedule in ``agora.schedules``,
    the API and the CLI. Missed ticks (no worker ran) are not made up: after an outage
    one job is enqueued for the tick that is due, then the schedule goes on. The job gets
    ``dedup_key`` ``<pipeline_id>@<tick>``. ``error_backoff_seconds`` and
    ``max_consecutive_errors`` are kept on the schedule row for the API; an enqueue that
    fails (the database away) is simply tried again, since nothing of it was written.
    """

    def __init__(
        self,
        kind: str,
        schedule: Schedule,
        *,
        payload: dict[str, Any] | None = None,
        queue: str = "default",
        priority: int = 0,
        max_retries: int | None = None,
        timeout_seconds: float | None = None,
        pipeline_id: str | None = None,
        error_backoff_seconds: float = 60.0,
        max_consecutive_errors: int = 10,
    ) -> None:
        pipeline_id = pipeline_id if pipeline_id is not None else f"periodic:{kind}"
        super().__init__(schedule, pipeline_id, error_backoff_seconds, max_consecutive_errors)
        if schedule.kind is ScheduleKind.CONTINUOUS:
            raise ValueError("a periodic job needs Schedule.cron, Schedule.every or Schedule.once: "
                             "Schedule.continuous would enqueue without pause")
        payload = {} if payload is None else dict(payload)
        if TICK_FIELD in payload:
            raise ValueError(f"payload must not hold {TICK_FIELD!r}: each job gets the tick's time there")
        # checked now, so that a bad kind, queue or payload fails at registration, not at the first tick
        self.template = JobSpec(kind, payload, queue=queue, priority=priority, max_retries=max_retries,
                                timeout_seconds=timeout_seconds)
        self.job_kind = kind

    @property
    def kind(self) -> str | None:
        """The kind each tick enqueues (stored on the schedule row)."""
        return self.job_kind

    def plan(self, due: DueTick) -> TickJob:
        """The job a due tick enqueues and the schedule's next run, by the database clock."""
        next_run = self.schedule.next_run_after_success(due.database_now, due.tick)
        # (from the tick, not the clock: a tick is enqueued a moment before it falls due)
        after = max(due.database_now, due.tick)
        return TickJob(self.pipeline_id, due.tick, self.job_for(due.tick), next_run.at_time(after))

    def job_for(self, tick: datetime) -> JobSpec:
        """The job one tick enqueues."""
        template = self.template
        when = tick.isoformat()
        return JobSpec(template.kind, {**template.payload, TICK_FIELD: when}, queue=template.queue,
                       priority=template.priority, max_retries=template.max_retries,
                       timeout_seconds=template.timeout_seconds, dedup_key=f"{self.pipeline_id}@{when}",
                       run_at=tick)
