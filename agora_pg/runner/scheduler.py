"""The scheduler: one per process, it turns the due ticks of the process's periodic jobs
and scheduled pipelines into ordinary jobs.

``run_once()`` is one pass, one transaction: the due schedule rows are locked (another
process's scheduler skips them) and each tick becomes a job. A periodic job's tick gets
a dedup key that names it, its schedule is advanced to its next run and the tick is
recorded as a run; a pipeline's tick becomes the pipeline's one live job (dedup key
``pipeline:<id>``), and its end sets the next run (a pipeline with a live job is not
due). A crash, a lost connection or a lost reply leaves either all of that or none of
it, so no tick is enqueued twice and none is lost. ``run()`` repeats it, sleeping until the next tick
falls due by the database's clock (at most ``MAX_WAIT``), woken at once when a schedule
is resumed or triggered. Every time comes from the database's clock, the first tick of
a new cron schedule included.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from agora_pg.db.schedule_rows import ScheduleRegistration, ScheduleRow, TickJob
from agora_pg.db.store import Store
from agora_pg.errors import ScheduleNotFound
from agora_pg.jobs import Job
from agora_pg.lifecycle import WakeSignal
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runner.scheduled_pipeline import PipelineSchedule
from agora_pg.runtime.database_calls import Stopped, retry_database
from agora_pg.runtime.process import ErrorWait

log = logging.getLogger("agora_pg.runner")

MAX_WAIT = 30.0  # an idle scheduler looks at its schedules at least this often
RETIRE_EVERY_SECONDS = 60.0  # how often a scheduler that retires orphaned schedules looks for them
MIN_WAIT = 0.05  # a tick due now that another process is enqueueing: look again shortly
# Ticks are enqueued this long before they fall due, as jobs due at the tick: at the tick
# only their promotion (by the workers' promoters) and claim remain, not the scheduler's
# whole pass (a thousand pipelines due at one minute: 45 ms of planning and inserting).
AHEAD_SECONDS = 0.2
CLOCK_MARGIN = 0.003  # wake this long after AHEAD_SECONDS before a tick


@dataclasses.dataclass(frozen=True)
class SchedulerPass:
    """What one pass did: the ticks it enqueued (with their jobs), and how long to wait
    before the next pass."""

    enqueued: list[tuple[TickJob, Job]]
    wait_seconds: float


class Scheduler:
    """Enqueues the ticks of ``schedules`` (periodic jobs and scheduled pipelines); see
    the module docstring. ``max_wait``: the longest sleep between
    passes (shorter when no notification will wake it)."""

    def __init__(
        self, store: Store, schedules: Sequence[PeriodicJob | PipelineSchedule],
        max_wait: float = MAX_WAIT, *, retire_undeclared: bool = False,
    ) -> None:
        self.store = store
        self.schedules = {item.pipeline_id: item for item in schedules}
        self.wanted = [(item.pipeline_id, item.schedule.spec) for item in schedules]
        self.launches: dict[str, str] = {}  # each once-per-launch pipeline's launch, once registered
        self.max_wait = max_wait
        self.rows: dict[str, ScheduleRow] = {}  # the schedules as last read, for the health server
        self.deleted: set[str] = set()  # schedules deleted while this process serves them
        self.retire_undeclared = retire_undeclared  # delete the orphaned schedules of other code
        self._retired_at = -RETIRE_EVERY_SECONDS
        self.passed = asyncio.Event()  # set after each pass that read the rows (the pool watches them)
        # called at each pipeline tick: the pipeline worker's wake (its runs' jobs are claimable
        # from their tick, with no promotion that would wake it)
        self.on_tick: Callable[[], None] | None = None
        self._tick_timer: asyncio.TimerHandle | None = None
        self._wake = WakeSignal()

    def wake(self) -> None:
        """Look at the schedules now (one was resumed, triggered, or a run ended)."""
        self._wake.set()

    async def register(self) -> None:
        """Create or update each schedule's row: a changed spec takes effect now, a new cron
        schedule's first tick is the next after the database's clock."""
        now = await self.store.database_now()
        for item in self.schedules.values():
            schedule = item.schedule
            self.rows[item.pipeline_id] = row = await self.store.schedules.upsert(ScheduleRegistration(
                pipeline_id=item.pipeline_id, kind=schedule.kind.value, spec=schedule.spec,
                first_run_at=schedule.first_run_at(now), error_backoff_seconds=item.error_backoff_seconds,
                max_consecutive_errors=item.max_consecutive_errors, new_launch=schedule.once_per_launch,
                job_kind=item.job_kind if isinstance(item, PeriodicJob) else None,
            ))
            if isinstance(item, PipelineSchedule):
                item.row = row
                item.stopped_at_launch = row.state == "stopped"
                if schedule.once_per_launch:
                    item.launch = self.launches[item.pipeline_id] = uuid.uuid4().hex
                    item.succeeded_here = False
                log.info("pipeline %s registered: %s, state %s, next run %s", item.pipeline_id, schedule.spec,
                         row.state, row.next_run_at)

    async def retire_orphans(self) -> None:
        """Delete the schedules no live process has declared for
        ``SCHEDULE_ORPHANED_AFTER_SECONDS``, except this process's own (their code is gone)."""
        for pipeline_id in await self.store.schedules.orphaned(list(self.schedules)):
            with contextlib.suppress(ScheduleNotFound):  # (another process retired it first)
                row, cancelled = await self.store.schedules.delete(pipeline_id)
                log.warning("schedule %s retired: no live process has declared it since %s (%d ticks cancelled)",
                            pipeline_id, row.orphaned_since, cancelled)
        self._retired_at = time.monotonic()

    async def run_once(self) -> SchedulerPass:
        """Enqueue every due tick; returns what was enqueued and how long to wait."""
        enqueued = await self.store.schedules.enqueue_due_ticks(
            self.wanted, lambda due: self.schedules[due.pipeline_id].plan(due), AHEAD_SECONDS,
            self.launches)
        for tick, job in enqueued:
            what = "pipeline" if tick.pipeline_run else "periodic job"
            log.info("%s %s: tick %s enqueued job %d", what, tick.pipeline_id, tick.tick.isoformat(), job.id)
        next_ticks = await self.store.schedules.next_ticks(self.wanted, self.launches)
        self._wake_pipeline_worker_in(next_ticks.run_in)
        due_in = next_ticks.due_in
        self.rows = await self.store.schedules.declared(list(self.schedules))
        if self.retire_undeclared and time.monotonic() - self._retired_at >= RETIRE_EVERY_SECONDS:
            await self.retire_orphans()
        for pipeline_id in sorted(self.schedules.keys() - self.rows.keys() - self.deleted):
            self.deleted.add(pipeline_id)
            item = self.schedules[pipeline_id]
            if isinstance(item, PipelineSchedule):
                item.row, item.deleted = None, True
            log.warning("schedule %s was deleted: this process runs no more of its ticks (its code declares it "
                        "again when the process next starts)", pipeline_id)
        for pipeline_id, row in self.rows.items():
            item = self.schedules[pipeline_id]
            if isinstance(item, PipelineSchedule):
                item.row = row
                item.stopped_at_launch = item.stopped_at_launch and row.state == "stopped"  # (not once resumed)
        self.passed.set()
        if due_in is None:
            wait = self.max_wait
        else:  # (a moment late by the database's clock: a wake a moment early finds nothing due)
            ahead = due_in - AHEAD_SECONDS
            wait = min(ahead + CLOCK_MARGIN if ahead > 0 else MIN_WAIT, self.max_wait)
        return SchedulerPass(enqueued, wait)

    def _wake_pipeline_worker_in(self, seconds: float | None) -> None:
        """Call ``on_tick`` ``seconds`` from now (by the database's clock: the reply came
        after it was read, so never early) and a moment; the last pass's time wins."""
        if self._tick_timer is not None:
            self._tick_timer.cancel()
            self._tick_timer = None
        if seconds is not None and self.on_tick is not None:
            self._tick_timer = asyncio.get_running_loop().call_later(max(seconds, 0.0) + CLOCK_MARGIN, self.on_tick)

    async def run(self, stop: asyncio.Event) -> None:
        """Register, then pass after pass until ``stop``; database errors are waited out."""
        try:
            await retry_database(self.register, what="registering schedules", stop=stop)
        except Stopped:
            return
        pause = ErrorWait(0.5)
        try:
            while not stop.is_set():
                self._wake.clear()  # before the pass: a change from now on wakes the wait below
                try:
                    wait = (await self.run_once()).wait_seconds
                    pause.reset()
                except Exception as error:  # the loop never ends on an error: it waits and looks again
                    wait = pause.after(error, "enqueueing scheduled runs", log)
                await self._wake.wait(wait)
        finally:
            self._wake_pipeline_worker_in(None)
