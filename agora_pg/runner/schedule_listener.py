"""Wake this process's scheduler when one of its schedule rows changes elsewhere (resumed,
triggered, or a pipeline's run ended): LISTEN on ``agora_schedules``."""

from __future__ import annotations

import asyncio

from agora_pg.db import queries
from agora_pg.db.store import Store
from agora_pg.runner.scheduler import Scheduler
from agora_pg.runtime.database_calls import listen_until


async def listen_for_schedule_changes(store: Store, scheduler: Scheduler, stop: asyncio.Event) -> None:
    """Until ``stop``: wake the scheduler when a notification names one of its schedules.
    Without the listener (or while it reconnects) it still looks at least every
    ``scheduler.max_wait`` seconds."""

    def on_change(pipeline_id: str) -> None:
        if pipeline_id in scheduler.schedules:
            scheduler.wake()

    await listen_until(store, {queries.SCHEDULES_CHANNEL: on_change}, stop, scheduler.wake,
                       "LISTEN for schedule changes")
