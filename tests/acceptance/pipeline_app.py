"""The worker module for scheduled-pipeline acceptance tests, configured by environment:

PIPELINE_SCHEDULE (every1s | hourly | once | once_key), PIPELINE_SLEEP (seconds a run takes),
PIPELINE_FAIL (1: every run raises), PIPELINE_EXIT (1: every run kills its process),
PIPELINE_BACKOFF, PIPELINE_MAX_ERRORS.
Every run records its start and end in public.pipeline_events, or, with LEDGER_DIR
set, in a file there (one per process), which needs no database.
"""

from __future__ import annotations

import asyncio
import os
import time

import asyncpg

from agora_pg.runner import Schedule, ScheduledPipeline, WorkerPool

CREATE_EVENTS = """
CREATE TABLE IF NOT EXISTS public.pipeline_events (
    id bigserial PRIMARY KEY, pid int NOT NULL, started_at timestamptz NOT NULL, finished_at timestamptz
)
"""

SCHEDULES = {
    "every1s": Schedule.every(seconds=1),
    "hourly": Schedule.every(hours=1),
    "once": Schedule.once(),
    "once_key": Schedule.once(key="2024"),
}


def _ledger(event: str) -> None:
    with open(os.path.join(os.environ["LEDGER_DIR"], f"pipeline-{os.getpid()}.log"), "a") as ledger_file:
        ledger_file.write(f"pipeline {os.getpid()} {event} {time.time():.6f}\n")


class RecordedRun:
    async def run(self) -> None:
        if os.environ.get("PIPELINE_EXIT") == "1":
            os._exit(9)  # as running out of memory would
        if os.environ.get("LEDGER_DIR"):
            await self._run_on_file()
            return
        connection = await asyncpg.connect(os.environ["AGORA_PG_DATABASE_URL"])
        try:
            event = await connection.fetchval(
                "INSERT INTO public.pipeline_events (pid, started_at) VALUES ($1, clock_timestamp()) RETURNING id",
                os.getpid(),
            )
            await asyncio.sleep(float(os.environ.get("PIPELINE_SLEEP", "0")))
            await connection.execute("UPDATE public.pipeline_events SET finished_at = clock_timestamp() WHERE id = $1", event)
        finally:
            await connection.close()
        if os.environ.get("PIPELINE_FAIL") == "1":
            raise RuntimeError("source unavailable")

    async def _run_on_file(self) -> None:
        _ledger("start")
        try:
            await asyncio.sleep(float(os.environ.get("PIPELINE_SLEEP", "0")))
        except asyncio.CancelledError:
            _ledger("stopped")
            raise
        _ledger("end")


async def build() -> RecordedRun:
    return RecordedRun()


def get_worker() -> WorkerPool:
    return WorkerPool(graceful_shutdown_timeout=float(os.environ.get("POOL_GRACE", "30"))).register(
        ScheduledPipeline(
            factory=build,
            schedule=SCHEDULES[os.environ.get("PIPELINE_SCHEDULE", "every1s")],
            pipeline_id="acceptance",
            error_backoff_seconds=float(os.environ.get("PIPELINE_BACKOFF", "60")),
            max_consecutive_errors=int(os.environ.get("PIPELINE_MAX_ERRORS", "10")),
        )
    )
