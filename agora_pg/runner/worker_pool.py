"""WorkerPool: runs ScheduledPipelines, PeriodicJobs and the job worker in one process.

A pool's scheduler turns the due ticks of its schedules into jobs; a pipeline's runs
are claimed by the pool's pipeline worker (a job ``Worker`` of the queue
``agora:pipelines`` that claims only this pool's pipelines, one run of each at a time).
The process lifecycle lives here: the first SIGINT/SIGTERM stops the scheduler, every
pipeline (a running one finishes its run; a resumable one after its current batch) and
the job worker; running work gets ``graceful_shutdown_timeout``, then is cut short (a
pipeline's run so cut is due again at once). A second signal cancels at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from typing import Any

from agora_pg.db import queries
from agora_pg.db.connect import resolve_database
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, DatabaseUnavailable, HandlerThreadStuck
from agora_pg.lifecycle import shutdown_signals, wait_tasks_or_event
from agora_pg.limits import KindLimit, QueueLimit
from agora_pg.outcomes import describe_error
from agora_pg.runner.health import DEFAULT_HOST, HealthServer
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runner.schedule_listener import listen_for_schedule_changes
from agora_pg.runner.scheduled_pipeline import PipelineSchedule, PipelineStatus, RunAbandoned, ScheduleStopped
from agora_pg.runner.scheduler import MAX_WAIT, Scheduler
from agora_pg.runtime.database_calls import StopSignal, Stopped, retry_database
from agora_pg.runtime.leases import LeaseSupervisor, supervising
from agora_pg.runtime.process import check_schema, new_worker_id, warn_unknown_settings
from agora_pg.runtime.process_metrics import PROCESS_METRICS
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.handlers import Handler
from agora_pg.worker.worker import Worker

log = logging.getLogger("agora_pg.runner")

TERMINAL_STATES = {"stopped"}


def pipeline_worker(
    handlers: dict[str, Handler], store: Store, settings: Settings
) -> tuple[Worker, Settings]:
    """A job worker of the pipelines' queue that claims the jobs of ``handlers``' pipelines
    and no other, and its settings: one run of each at a time, as long as it runs, no
    pruning (the job worker's)."""
    worker = Worker(handlers, resources=store)
    return worker, settings.replace(queues=(queries.PIPELINE_QUEUE,), concurrency=len(handlers), job_timeout=None,
                                    retention=None)


class PipelineFailed(AgoraError):
    """A pipeline reached ``max_consecutive_errors``; the pool shut down because of it."""

    def __init__(self, pipeline_id: str, consecutive_errors: int | None, error: BaseException) -> None:
        _type, message = describe_error(error)
        if consecutive_errors is None:  # not a pipeline error: agora-pg itself failed
            super().__init__(f"pipeline {pipeline_id!r} crashed: {message}")
        else:
            super().__init__(f"pipeline {pipeline_id!r} stopped after {consecutive_errors} consecutive errors: {message}")
        self.pipeline_id = pipeline_id
        self.error = error


class JobWorkerStopped(AgoraError):
    """The pool's job worker (or pipeline worker) ended without being asked to; the pool shut down."""


class WorkerPool:
    """Runs every registered ScheduledPipeline, and a job ``Worker`` if one is
    registered, as concurrent asyncio tasks; the ticks of registered ``PeriodicJob``s are
    enqueued by the pool's ``Scheduler``. ``health_port`` starts a
    HealthServer (/health, /ready, /metrics) on ``health_host`` (loopback unless
    ``WORKER_HEALTH_HOST`` or this says otherwise); without it there is no server.
    ``retire_undeclared_schedules``: delete the schedules that no live process has
    declared for ``SCHEDULE_ORPHANED_AFTER_SECONDS`` (120 s) and this pool does not
    declare (their code is gone), looking every minute; off by default, for a database
    whose every schedule belongs to the code of this pool's deployment."""

    def __init__(
        self,
        health_port: int | None = None,
        graceful_shutdown_timeout: float = 30.0,
        *,
        settings: Settings | None = None,
        health_host: str = DEFAULT_HOST,
        retire_undeclared_schedules: bool = False,
    ) -> None:
        if graceful_shutdown_timeout < 0:
            raise ValueError("graceful_shutdown_timeout must be >= 0")
        self.health_port = health_port
        self.health_host = health_host
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.retire_undeclared_schedules = retire_undeclared_schedules
        self.settings = settings
        self.pipelines: list[PipelineSchedule] = []
        self.periodic_jobs: list[PeriodicJob] = []
        self.job_worker: Worker | None = None
        self.pipeline_worker: Worker | None = None
        self.scheduler: Scheduler | None = None
        self.health: HealthServer | None = None
        self._stopping = StopSignal()
        self._aborting = StopSignal()
        self._store: Store | None = None
        self._error_details = False
        # an agora/v1 config's [kinds] tables: declared at start, over the code's (None: left alone)
        self.kind_limits: dict[str, KindLimit] | None = None
        self.queue_limits: dict[str, QueueLimit] | None = None  # and its [queues] tables, alike

    def register(self, item: PipelineSchedule | PeriodicJob | Worker) -> WorkerPool:
        """Add a ScheduledPipeline, a PeriodicJob or the job Worker; returns self for chaining."""
        if isinstance(item, Worker):
            if self.job_worker is not None:
                raise ValueError("a WorkerPool runs one job Worker; give it all the handlers")
            self.job_worker = item
        elif isinstance(item, PipelineSchedule | PeriodicJob):
            if item.pipeline_id in {p.pipeline_id for p in self.pipelines} | {p.pipeline_id for p in self.periodic_jobs}:
                raise ValueError(f"pipeline_id {item.pipeline_id!r} is registered twice")
            if isinstance(item, PeriodicJob):
                self.periodic_jobs.append(item)
            else:
                self.pipelines.append(item)
                item._stop_pool = self.stop  # its stop() stops the pool
        else:
            raise TypeError(f"register() takes a ScheduledPipeline, a PeriodicJob or a Worker, "
                            f"got {type(item).__name__}")
        return self

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        if self.scheduler is not None:
            self.scheduler.wake()
        for pipeline in self.pipelines:
            pipeline.stop()
        for worker in self._workers():
            worker.stop()

    def abort(self) -> None:
        """Skip the graceful wait: cancel everything now."""
        self._aborting.set()
        for worker in self._workers():
            worker.abort()
        self.stop()

    def _workers(self) -> list[Worker]:
        return [worker for worker in (self.job_worker, self.pipeline_worker) if worker is not None]

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until shutdown; raises ``PipelineFailed`` if a pipeline stopped for errors
        (or ``JobWorkerStopped`` if the job worker ended on its own)."""
        warn_unknown_settings()
        settings = self.settings or load_settings(os.environ)
        if self.job_worker is not None:
            settings = self.job_worker.effective_settings()
        for periodic in self.periodic_jobs:  # (jobs of its worker's kind, left for some other worker)
            if periodic.job_kind in getattr(self.job_worker, "handlers", ()) and \
                    (queue := periodic.template.queue) not in settings.queues:
                log.warning("periodic job %r enqueues into queue %r, which this pool's worker does not claim "
                            "(queues=%s): run it with --queues %s", periodic.job_kind, queue,
                            ",".join(settings.queues), ",".join((*settings.queues, str(queue))))
        if settings.health_port is not None:  # WORKER_HEALTH_PORT: over the code's or config's
            self.health_port = settings.health_port
        if settings.health_host is not None:
            self.health_host = settings.health_host
        self._error_details = settings.health_error_details
        with shutdown_signals(self.stop, self.abort) if handle_signals else contextlib.nullcontext():
            async with resolve_database(settings) as database:
                store = Store.open(database, pool_size=5, timeout=settings.database_timeout)
                self._store = store
                try:
                    await check_schema(store)
                    if ((self.kind_limits is not None or self.queue_limits is not None)
                            and not await self._declare_limits(store)):
                        return  # stopped before it could
                    await self._serve(store, settings)
                finally:
                    self._store = None
                    await store.close()

    async def _declare_limits(self, store: Store) -> bool:
        """Declare the config's flow control (waiting out an unreachable database); False
        when stopped first."""
        limits, queues = self.kind_limits, self.queue_limits

        async def declare() -> tuple[list[str], list[str]]:
            kinds_released = [] if limits is None else await store.jobs.declare_limits(limits, config=True)
            queues_released = [] if queues is None else await store.jobs.declare_queue_limits(queues, config=True)
            return kinds_released, queues_released

        try:
            released, queues_released = await retry_database(declare, what="declaring the limits",
                                                             stop=self._stopping)
        except Stopped:
            return False
        if limits is not None:
            log.info("flow control of %s declared by the config%s", ", ".join(sorted(limits)) or "no kind",
                     f"; released {', '.join(released)} to the code's" if released else "")
        if queues is not None:
            log.info("limits of queues %s declared by the config%s", ", ".join(sorted(queues)) or "none",
                     f"; released {', '.join(queues_released)} to the code's" if queues_released else "")
        return True

    async def _serve(self, store: Store, settings: Settings) -> None:
        worker_id = self.job_worker.id if self.job_worker is not None else new_worker_id()
        async with supervising(None, store.database, worker_id, settings) as supervisor:
            await self._serve_with(store, settings, supervisor)

    async def _serve_with(self, store: Store, settings: Settings, supervisor: LeaseSupervisor) -> None:
        if self.health_port is not None:  # first: a port in use stops the pool before anything runs
            self.health = HealthServer(self.health_port, self._live, self._ready, self.health_host, self._metrics)
            await self.health.start()
        worker_settings = settings.replace(shutdown_timeout=self.graceful_shutdown_timeout)
        tasks: dict[asyncio.Task[Any], Worker] = {}
        if self.job_worker is not None:
            serving = self.job_worker.serve(store, worker_settings, supervisor)
            tasks[asyncio.create_task(serving, name="jobs")] = self.job_worker
        if self.pipelines:
            self.pipeline_worker, pipeline_settings = pipeline_worker(
                {pipeline.pipeline_id: pipeline.run_job for pipeline in self.pipelines}, store, worker_settings)
            serving = self.pipeline_worker.serve(store, pipeline_settings)
            tasks[asyncio.create_task(serving, name="pipelines")] = self.pipeline_worker
        scheduling = None
        if self.pipelines or self.periodic_jobs:
            self.scheduler = Scheduler(store, [*self.pipelines, *self.periodic_jobs],
                                       MAX_WAIT if settings.notifications else settings.poll_seconds,
                                       retire_undeclared=self.retire_undeclared_schedules)
            if self.pipeline_worker is not None:
                self.scheduler.on_tick = self.pipeline_worker.wake
            scheduling = asyncio.create_task(self.scheduler.run(self._stopping), name="scheduler")
        listener_stop = asyncio.Event()
        listener = (
            asyncio.create_task(listen_for_schedule_changes(store, self.scheduler, listener_stop), name="schedules")
            if self.scheduler is not None and settings.notifications else None
        )
        failure: AgoraError | None = None
        try:
            failure = await self._watch(tasks)
            await self._shut_down(tasks)
        finally:
            if scheduling is not None:
                self.stop()  # (a failure may end the pool before a stop was asked for)
                await asyncio.wait([scheduling], timeout=5)
                scheduling.cancel()
            listener_stop.set()
            if listener is not None:
                await asyncio.wait([listener], timeout=5)
                listener.cancel()
            if self.health is not None:
                await self.health.close()
        if failure is not None:
            log.error("%s", failure)
            raise failure

    async def _watch(self, tasks: dict[asyncio.Task[Any], Worker]) -> AgoraError | None:
        """Wait for a shutdown signal, a worker's end, a pipeline's stop after too many
        errors, or (with no job worker and no periodic job) the end of every pipeline."""
        stopper: asyncio.Task[Any] = asyncio.create_task(self._stopping.wait())
        watcher: asyncio.Task[AgoraError | None] = asyncio.create_task(self._watch_pipelines())
        try:
            done, _ = await asyncio.wait([*tasks, stopper, watcher], return_when=asyncio.FIRST_COMPLETED)
            if watcher in done:
                return watcher.result()
            if self._stopping.is_set():
                return None
            task = next(task for task in done if task in tasks)
            error = None if task.cancelled() else task.exception()
            if isinstance(error, HandlerThreadStuck):  # (said in one line: it asks for a restart)
                return error
            name = "job worker" if tasks[task] is self.job_worker else "pipeline worker"
            log.error("the %s stopped unexpectedly; shutting the pool down", name, exc_info=error)
            return JobWorkerStopped(f"the {name} stopped unexpectedly: {error!r}")
        finally:
            stopper.cancel()
            watcher.cancel()

    async def _watch_pipelines(self) -> AgoraError | None:
        """After each of the scheduler's passes: a pipeline whose schedule stopped ends the
        pool with its error; a once-per-launch schedule another launch completed runs again
        for this one; when every pipeline is done and nothing else runs here, the pool ends."""
        if self.scheduler is None or not self.pipelines:
            await asyncio.Event().wait()  # (until cancelled)
        assert self.scheduler is not None
        while True:
            await self.scheduler.passed.wait()
            self.scheduler.passed.clear()
            done = 0
            for pipeline in self.pipelines:
                row = pipeline.row
                if row is None or row.schedule_spec != pipeline.schedule.spec:
                    continue
                if row.state == "stopped":
                    if pipeline.stopped_at_launch:
                        return ScheduleStopped(pipeline.pipeline_id, row.consecutive_errors, row.last_error)
                    log.error("pipeline %s reached max_consecutive_errors; shutting the pool down",
                              pipeline.pipeline_id)
                    error = pipeline.last_error or RunAbandoned(
                        f"{row.last_error} ({row.consecutive_errors} failed runs in a row)")
                    return PipelineFailed(pipeline.pipeline_id, row.consecutive_errors, error)
                if row.state == "completed" and row.job_id is None:
                    if pipeline.launch is not None and not pipeline.succeeded_here:
                        # a run of this launch, run by another process's worker?
                        pipeline.succeeded_here = await self.scheduler.store.schedules.launch_succeeded(
                            pipeline.pipeline_id, pipeline.launch)
                    if pipeline.launch is not None and not pipeline.succeeded_here:
                        # another launch's run completed it meanwhile: this one runs it too
                        await self.scheduler.store.schedules.launch_once_again(pipeline.pipeline_id,
                                                                               pipeline.schedule.spec)
                        self.scheduler.wake()
                    else:
                        done += 1
            if done == len(self.pipelines) and self.job_worker is None and not self.periodic_jobs:
                log.info("every pipeline of this pool has completed its schedule")
                return None

    async def _shut_down(self, tasks: dict[asyncio.Task[Any], Worker]) -> None:
        self.stop()
        for worker in self._workers():  # (also those started after a stop that came during start-up)
            worker.stop()
        pending = await wait_tasks_or_event(tasks, self._aborting, self.graceful_shutdown_timeout)
        if pending:
            log.warning("graceful shutdown over; stopping %s", sorted(task.get_name() for task in pending))
            if self._aborting.is_set():  # a second signal: they stop at once
                for worker in self._workers():
                    worker.abort()
            # (otherwise the workers, whose grace period is this one, stop their running
            # jobs themselves now and finish their own bounded shutdown)
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _live(self) -> tuple[bool, dict[str, Any]]:
        """Live unless a sync handler's thread was given up: then the process asks to be restarted."""
        stuck = [thread.as_json() for thread in PROCESS_METRICS.stuck_threads.values()]
        if stuck:
            return False, {"status": "restart needed", "stuck_threads": stuck, "pipelines": self._pipeline_report()}
        return True, {"status": "ok", "pipelines": self._pipeline_report()}

    async def _ready(self) -> tuple[bool, dict[str, Any]]:
        body: dict[str, Any] = {"pipelines": self._pipeline_report()}
        healthy = True
        try:
            assert self._store is not None
            await asyncio.wait_for(self._store.ping(), timeout=2)
            body["database"] = "ok"
        except (DatabaseUnavailable, TimeoutError, AssertionError) as error:
            log.warning("health server answering not ready: %s", error or "no answer within 2s")
            body["database"] = "unavailable (the worker's log says why)"  # no address to callers with no login
            healthy = False
        stopped = [pipeline_id for pipeline_id, status in self._statuses().items() if status.state in TERMINAL_STATES]
        if stopped:
            body["stopped_pipelines"] = stopped
            healthy = False
        body["status"] = "ready" if healthy else "not ready"
        return healthy, body

    async def _metrics(self) -> tuple[bytes, str]:
        from agora_pg.api.metrics import CONTENT_TYPE, render_metrics

        if self._store is None:
            raise DatabaseUnavailable("the pool is not running")
        return render_metrics(await self._store.metrics(), PROCESS_METRICS), CONTENT_TYPE

    def _statuses(self) -> dict[str, PipelineStatus]:
        """Every schedule this pool serves: its pipelines, then its periodic jobs."""
        statuses = {p.pipeline_id: p.status for p in self.pipelines}
        rows = self.scheduler.rows if self.scheduler is not None else {}
        for periodic in self.periodic_jobs:
            statuses[periodic.pipeline_id] = PipelineStatus.of(
                periodic.pipeline_id, rows.get(periodic.pipeline_id),
                deleted=self.scheduler is not None and periodic.pipeline_id in self.scheduler.deleted)
        return statuses

    def _pipeline_report(self) -> dict[str, Any]:
        return {pipeline_id: status.as_json(error_details=self._error_details)
                for pipeline_id, status in self._statuses().items()}


class ScheduledPipeline(PipelineSchedule):
    """Runs ``await factory()`` then ``await pipeline.run()`` on ``schedule``.

    A raise from the factory, the run or the close is a failed run: the next
    attempt waits ``error_backoff_seconds * 2**(n-1)`` (at most 10 minutes) after
    the n-th failure in a row; after ``max_consecutive_errors`` failures in a row
    the schedule stops and ``start()`` raises the last error. A success resets
    the counter.
    """

    async def start(self) -> None:
        """Run until stopped, on the database of the environment (or the embedded one):
        a ``WorkerPool`` of this pipeline alone."""
        try:
            await WorkerPool().register(self).run(handle_signals=False)
        except PipelineFailed as failed:
            raise failed.error from None
