"""A pipeline run now, outside its schedule (``agora-pg run``, and the replays of
``agora-pg dlq replay`` and ``POST /dead-letters/{pipeline_id}/replay``): a job like a
scheduled run's.

The run is a job of the queue ``agora:pipelines`` (kind: the pipeline id) that this
process enqueues and claims with a worker of its own, so it has a lease, a fence and a
rescue like every run: a process killed mid-run leaves a job whose lease passes, and
any worker's rescuer records the run ``abandoned``. The job's dedup key is the
pipeline's, so the run never overlaps one in flight: it waits for that one to end (or
for its lease to pass, rescuing it then itself), or with ``wait=False`` refuses with
``RunInFlight``. It changes no schedule.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from agora_pg.db.store import Store
from agora_pg.db import queries
from agora_pg.db.schedule_table import record_ticks
from agora_pg.errors import AgoraError
from agora_pg.jobs import Job, JobStatus
from agora_pg.runner.scheduled_pipeline import Factory, pipeline_run_job, run_pipeline_job
from agora_pg.runner.worker_pool import pipeline_worker
from agora_pg.settings import Settings

log = logging.getLogger("agora_pg.runner")

POLL_SECONDS = 0.2  # how often the run's job is looked at while another process may run it
RESCUE_BATCH = 100  # jobs whose lease passed, taken back per look while waiting
ENDED = {JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}
NO_GRACE_LIMIT = 10.0**9  # the run is the point of the process: stopping its worker never cuts it short


class RunInFlight(AgoraError):
    """A run of the pipeline (scheduled, ad hoc or a replay) is in flight."""

    def __init__(self, pipeline_id: str, job_id: int) -> None:
        super().__init__(f"a run of {pipeline_id} is in flight (job {job_id}); try again when it has ended")
        self.pipeline_id = pipeline_id
        self.job_id = job_id


async def run_now(
    store: Store, settings: Settings, pipeline_id: str, factory: Factory, *, wait: bool = True, **payload: Any,
) -> Job:
    """Run ``factory``'s pipeline once as a job of ``pipeline_id`` (with ``payload``:
    ``replay=limit`` replays dead letters), here (or wherever a worker claims it first),
    after any run of it in flight (``wait=False``: ``RunInFlight`` instead); returns the
    job once it has ended."""
    job = await _enqueue_after_run_in_flight(store, settings, pipeline_id, wait, payload or {"run": "now"})
    started = asyncio.Event()

    async def handler(claimed: Job, resources: Store) -> Any:
        started.set()
        return await run_pipeline_job(factory, claimed, resources)

    worker, run_settings = pipeline_worker({pipeline_id: handler}, store, settings)
    serving = asyncio.create_task(worker.serve(store, run_settings.replace(shutdown_timeout=NO_GRACE_LIMIT)))
    try:
        while True:
            if started.is_set():
                worker.stop()  # no other job: this one runs to its end, then the worker stops
            current = await store.jobs.get(job.id)
            if current.status in ENDED:
                return current
            done, _ = await asyncio.wait([serving], timeout=POLL_SECONDS)
            if done and not started.is_set():
                serving.result()  # the worker's own error, if any
                raise AgoraError(f"pipeline {pipeline_id}: the worker stopped before job {job.id} started")
    finally:
        worker.stop()
        await serving


async def enqueue_run(store: Store, pipeline_id: str, **payload: Any) -> tuple[Job, bool]:
    """Enqueue a run of ``pipeline_id`` outside its schedule (its run plan is empty),
    due now; ``(the run in flight, False)`` when there is one."""
    async with store.connection() as connection, connection.transaction():
        when = await connection.fetchval(queries.DATABASE_NOW)
        [(job, inserted)] = await store.jobs.enqueue([pipeline_run_job(pipeline_id, when, **payload)],
                                                     connection=connection)
        if inserted:
            await record_ticks(connection, [(job.id, pipeline_id, when, {}, None)])
    return job, inserted


async def _enqueue_after_run_in_flight(
    store: Store, settings: Settings, pipeline_id: str, wait: bool, payload: dict[str, Any],
) -> Job:
    """The run's job, enqueued once no run of the pipeline is in flight (a run whose worker
    died is rescued here once its lease has passed)."""
    waiting_for = None
    while True:
        job, inserted = await enqueue_run(store, pipeline_id, **payload)
        if inserted:
            return job
        if wait and waiting_for != job.id:  # (said first, even when its lease has passed already)
            log.warning("pipeline %s: a run is in flight (job %d); waiting for it to end", pipeline_id, job.id)
            waiting_for = job.id
        rescued = await store.jobs.rescue_expired(settings.max_lost_attempts, settings.max_retries, RESCUE_BATCH,
                                                   lease_seconds=settings.lease_seconds)
        if job.id in rescued:
            continue
        if not wait:
            raise RunInFlight(pipeline_id, job.id)
        await asyncio.sleep(POLL_SECONDS)
