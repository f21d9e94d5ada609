"""Wake the pipelines (and the scheduler) of this process when their schedule row changes
elsewhere (``POST /schedules/{id}/resume`` or ``/trigger``): LISTEN on ``agora_schedules``."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.runner.scheduled_pipeline import ScheduledPipeline
from agora_pg.runner.scheduler import Scheduler
from agora_pg.runtime.database_calls import listen_until


async def listen_for_schedule_changes(
    store: Store, pipelines: Sequence[ScheduledPipeline], stop: asyncio.Event, scheduler: Scheduler | None = None
) -> None:
    """Until ``stop``: wake the pipeline (or the scheduler of the periodic job) a
    notification names. Without the listener (or while it reconnects) both still look at
    their rows at least every 30 s."""
    by_id = {pipeline.pipeline_id: pipeline for pipeline in pipelines}

    def on_change(pipeline_id: str) -> None:
        pipeline = by_id.get(pipeline_id)
        if pipeline is not None:
            pipeline.wake()
        elif scheduler is not None and pipeline_id in scheduler.periodic_jobs:
            scheduler.wake()

    def wake_all() -> None:  # a change may have come while not listening
        for pipeline in pipelines:
            pipeline.wake()
        if scheduler is not None:
            scheduler.wake()

    await listen_until(store, {queries.SCHEDULES_CHANNEL: on_change}, stop, wake_all, "LISTEN for schedule changes")
