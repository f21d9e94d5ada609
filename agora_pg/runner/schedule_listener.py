"""Wake the pipelines of this process when their schedule row changes elsewhere
(``POST /schedules/{id}/resume`` or ``/trigger``): LISTEN on ``agora_schedules``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.lifecycle import wait_for_event
from agora_pg.runner.scheduled_pipeline import ScheduledPipeline
from agora_pg.worker.worker import ErrorWait

log = logging.getLogger("agora_pg.runner")


async def listen_for_schedule_changes(store: Store, pipelines: Sequence[ScheduledPipeline], stop: asyncio.Event) -> None:
    """Until ``stop``: wake the pipeline a notification names. Without the listener (or
    while it reconnects) pipelines still look at their rows at least every 30 s."""
    by_id = {pipeline.pipeline_id: pipeline for pipeline in pipelines}
    error_wait = ErrorWait(0.5)

    def on_change(pipeline_id: str) -> None:
        pipeline = by_id.get(pipeline_id)
        if pipeline is not None:
            pipeline.wake()

    while not stop.is_set():
        try:
            listener = await store.listen(on_change, queries.SCHEDULES_CHANNEL)
        except DatabaseUnavailable as error:
            wait = error_wait.next()
            log.warning("LISTEN for schedule changes failed; retrying in %.1fs: %s", wait, error)
            await wait_for_event(stop, wait)
            continue
        error_wait.reset()
        for pipeline in pipelines:
            pipeline.wake()  # a change may have come while not listening
        stopper = asyncio.create_task(stop.wait())
        watched: list[asyncio.Future[Any]] = [stopper, listener.closed]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        await listener.close()
