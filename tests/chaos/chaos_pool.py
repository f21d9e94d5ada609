"""The worker module of the ``schedules_under_faults`` scenario:
``agora-pg worker --module tests.chaos.chaos_pool``, a WorkerPool with five schedules.

Each run appends ``start``, then ``end`` (or ``stopped``), with its pipeline, job id,
process and time, to this process's file in ``$CHAOS_LEDGER_DIR``.
"""

from __future__ import annotations

import asyncio
import os
import time

from agora_pg.pipelines.pipeline import current_run
from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool

SCHEDULES = {
    "every_1s": Schedule.every(seconds=1),
    "every_2s": Schedule.every(seconds=2),
    "cron_minutely": Schedule.cron("* * * * *"),
    "continuous": Schedule.continuous(),
    "once_ever": Schedule.once(key="chaos"),
}
RUN_SECONDS = 0.3


def _write(pipeline_id: str, run_id: int | None, event: str) -> None:
    path = os.path.join(os.environ["CHAOS_LEDGER_DIR"], f"{os.getpid()}.runs")
    with open(path, "a", encoding="utf-8") as ledger:
        ledger.write(f"{pipeline_id} {run_id} {os.getpid()} {event} {time.time():.6f}\n")


class RecordedRun:
    def __init__(self, pipeline_id: str) -> None:
        self.pipeline_id = pipeline_id

    async def run(self) -> None:
        run = current_run.get()
        run_id = None if run is None else run.job_id or run.run_id  # a scheduled run is a job
        _write(self.pipeline_id, run_id, "start")
        try:
            await asyncio.sleep(RUN_SECONDS)
        except BaseException:
            _write(self.pipeline_id, run_id, "stopped")
            raise
        _write(self.pipeline_id, run_id, "end")


def factory_for(pipeline_id: str):  # noqa: ANN201 - a factory
    async def build() -> RecordedRun:
        return RecordedRun(pipeline_id)

    return build


def get_worker() -> WorkerPool:
    pool = WorkerPool(graceful_shutdown_timeout=5.0)
    for pipeline_id, schedule in SCHEDULES.items():
        pool.register(ScheduledPipeline(factory_for(pipeline_id), schedule, pipeline_id, error_backoff_seconds=0.5,
                                        max_consecutive_errors=1000))
    return pool
