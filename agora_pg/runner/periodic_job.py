"""Periodic jobs: a schedule that enqueues one job of a kind per tick, across all workers.

A ``PeriodicJob`` is a ``ScheduledPipeline`` whose run enqueues the job: every process
that registers it competes for each tick through the schedule's row, so a tick is
claimed once whatever the number of workers (the leaderless tick key of scheduled
pipelines), and its history, pause/resume/trigger and error counters are those of any
schedule.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from agora_pg.job_spec import JobSpec
from agora_pg.pipelines.pipeline import current_run
from agora_pg.runner.scheduled_pipeline import ScheduledPipeline
from agora_pg.schedules import Schedule, ScheduleKind

TICK_FIELD = "scheduled_for"  # the payload key that carries the tick's time (ISO 8601, UTC)


class PeriodicJob(ScheduledPipeline):
    """Enqueue a job of ``kind`` on ``schedule``, once per tick across all workers, with
    the tick's time in ``payload["scheduled_for"]``.

    >>> pool.register(PeriodicJob("send_report", Schedule.cron("0 8 * * 1-5", "Europe/Berlin"),
    ...                           payload={"to": "team@example.com"}))

    ``pipeline_id`` (default ``periodic:<kind>``) names the schedule in ``agora.schedules``,
    the API and the CLI. Missed ticks (no worker ran) are not made up: after an outage
    one job is enqueued for the tick that is due, then the schedule goes on. The job gets
    ``dedup_key`` ``<pipeline_id>@<tick>``, so that a tick run again after its worker died
    between the enqueue and recording the run does not add a second live job.
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
        if isinstance(schedule, Schedule) and schedule.kind is ScheduleKind.CONTINUOUS:
            raise ValueError("a periodic job needs Schedule.cron, Schedule.every or Schedule.once: "
                             "Schedule.continuous would enqueue without pause")
        payload = {} if payload is None else dict(payload)
        if TICK_FIELD in payload:
            raise ValueError(f"payload must not hold {TICK_FIELD!r}: each job gets the tick's time there")
        # checked now, so that a bad kind, queue or payload fails at registration, not at the first tick
        self.template = JobSpec(kind, payload, queue=queue, priority=priority, max_retries=max_retries,
                                timeout_seconds=timeout_seconds)
        self.job_kind = kind
        super().__init__(self._enqueuer, schedule, pipeline_id or f"periodic:{kind}",
                         error_backoff_seconds, max_consecutive_errors)

    async def _enqueuer(self) -> _EnqueueTick:
        return _EnqueueTick(self)

    def job_for(self, tick: datetime) -> JobSpec:
        """The job one tick enqueues."""
        template = self.template
        when = tick.isoformat()
        return JobSpec(template.kind, {**template.payload, TICK_FIELD: when}, queue=template.queue_name,
                       priority=template.priority, max_retries=template.max_retries,
                       timeout_seconds=template.timeout_seconds, dedup_key=f"{self.pipeline_id}@{when}")


class _EnqueueTick:
    """One tick's run: enqueue the job (the runner records the run as any other)."""

    def __init__(self, periodic: PeriodicJob) -> None:
        self.periodic = periodic

    async def run(self) -> None:
        run = current_run.get()
        if run is None or run.scheduled_for is None:
            raise RuntimeError("a periodic job runs only on its schedule, in a WorkerPool")
        await run.store.enqueue([self.periodic.job_for(run.scheduled_for)])

    async def close(self) -> None:
        pass
