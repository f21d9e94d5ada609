"""Scheduled pipelines and the worker runtime: ``from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool``."""

from agora_pg.runner.health import HealthServer
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runner.scheduled_pipeline import PipelineStatus, RunAbandoned, ScheduleStopped
from agora_pg.runner.worker_pool import JobWorkerStopped, PipelineFailed, ScheduledPipeline, WorkerPool
from agora_pg.schedules import Schedule

__all__ = [
    "HealthServer", "JobWorkerStopped", "PeriodicJob", "PipelineFailed", "PipelineStatus", "RunAbandoned", "Schedule",
    "ScheduleStopped", "ScheduledPipeline", "WorkerPool",
]
