"""The scheduler: one per process, it turns the due ticks of the process's periodic jobs
into ordinary jobs.

``run_once()`` is one pass, one transaction: the due schedule rows are locked (another
process's scheduler skips them), each tick becomes a job whose dedup key names the tick,
each schedule is advanced to its next run and each tick is recorded as a run. A crash,
a lost connection or a lost reply leaves either all of that or none of it, so no tick is
enqueued twice and none is lost. ``run()`` repeats it, sleeping until the next tick
falls due by the database's clock (at most ``MAX_WAIT``), woken at once when a schedule
is resumed or triggered. Every time comes from the database's clock, the first tick of
a new cron schedule included.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence

from agora_pg.db.schedule_rows import DueTick, ScheduleRegistration, ScheduleRow, TickJob
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.jobs import Job
from agora_pg.lifecycle import WakeSignal
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runtime.database_calls import Stopped, retry_database
from agora_pg.runtime.process import ErrorWait

log = logging.getLogger("agora_pg.runner")

MAX_WAIT = 30.0  # an idle scheduler looks at its schedules at least this often
MIN_WAIT = 0.05  # a tick due now that another process is enqueueing: look again shortly


@dataclasses.dataclass(frozen=True)
class SchedulerPass:
    """What one pass did: the ticks it enqueued (with their jobs), and how long to wait
    before the next pass."""

    enqueued: list[tuple[TickJob, Job]]
    wait_seconds: float


class Scheduler:
    """Enqueues the ticks of ``periodic_jobs`` as ``worker_id``; see the module docstring."""

    def __init__(self, store: Store, worker_id: str, periodic_jobs: Sequence[PeriodicJob]) -> None:
        self.store = store
        self.worker_id = worker_id
        self.periodic_jobs = {periodic.pipeline_id: periodic for periodic in periodic_jobs}
        self.wanted = [(periodic.pipeline_id, periodic.schedule.spec) for periodic in periodic_jobs]
        self.rows: dict[str, ScheduleRow] = {}  # the schedules as last read, for the health server
        self._wake = WakeSignal()

    def wake(self) -> None:
        """Look at the schedules now (one was resumed or triggered)."""
        self._wake.set()

    async def register(self) -> None:
        """Create or update each schedule's row: a changed spec takes effect now, a new cron
        schedule's first tick is the next after the database's clock."""
        now = await self.store.database_now()
        for periodic in self.periodic_jobs.values():
            schedule = periodic.schedule
            self.rows[periodic.pipeline_id] = await self.store.schedules.upsert(ScheduleRegistration(
                pipeline_id=periodic.pipeline_id, kind=schedule.kind.value, spec=schedule.spec,
                first_run_at=schedule.first_run_at(now), error_backoff_seconds=periodic.error_backoff_seconds,
                max_consecutive_errors=periodic.max_consecutive_errors, new_launch=schedule.once_per_launch,
                job_kind=periodic.job_kind,
            ))

    def plan(self, due: DueTick) -> TickJob:
        """The job a due tick enqueues and the schedule's next run, by the database clock."""
        periodic = self.periodic_jobs[due.pipeline_id]
        next_run = periodic.schedule.next_run_after_success(due.database_now, due.tick)
        return TickJob(due.pipeline_id, due.tick, periodic.job_for(due.tick), next_run.at_time(due.database_now))

    async def run_once(self) -> SchedulerPass:
        """Enqueue every due tick; returns what was enqueued and how long to wait."""
        enqueued = await self.store.schedules.enqueue_due_ticks(self.wanted, self.plan, self.worker_id)
        for tick, job in enqueued:
            log.info("periodic job %s: tick %s enqueued job %d (kind %r)", tick.pipeline_id, tick.tick.isoformat(),
                     job.id, job.kind)
        due_in = await self.store.schedules.next_tick_in(self.wanted)
        self.rows = await self.store.schedules.get_many(list(self.periodic_jobs))
        wait = MAX_WAIT if due_in is None else min(max(due_in, MIN_WAIT), MAX_WAIT)
        return SchedulerPass(enqueued, wait)

    async def run(self, stop: asyncio.Event) -> None:
        """Register, then pass after pass until ``stop``; database errors are waited out."""
        try:
            await retry_database(self.register, what="registering periodic jobs", stop=stop)
        except (Stopped, DatabaseUnavailable):
            return
        pause = ErrorWait(0.5)
        while not stop.is_set():
            self._wake.clear()  # before the pass: a change from now on wakes the wait below
            try:
                wait = (await self.run_once()).wait_seconds
                pause.reset()
            except DatabaseUnavailable as error:
                wait = pause.next()
                log.warning("enqueueing periodic jobs: %s; retrying in %.1fs", error, wait)
            except Exception:  # the loop never ends on an error: it waits and looks again
                wait = pause.next()
                log.exception("enqueueing periodic jobs failed; retrying in %.1fs", wait)
            await self._wake.wait(wait)
