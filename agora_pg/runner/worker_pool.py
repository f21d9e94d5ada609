"""WorkerPool: runs ScheduledPipelines and the job worker in one process.

The process lifecycle lives here: the first SIGINT/SIGTERM sets the shutdown
event and stops every pipeline (sleeping ones exit at once, running ones finish
their run) and the job worker; the pool waits up to
``graceful_shutdown_timeout``, then force-cancels what is left. A second signal
cancels at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from typing import Any

from agora_pg.db.connect import resolve_database
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, DatabaseUnavailable
from agora_pg.lifecycle import shutdown_signals, wait_tasks_or_event
from agora_pg.outcomes import describe_error
from agora_pg.runner.health import DEFAULT_HOST, HealthServer
from agora_pg.runner.periodic_job import PeriodicJob
from agora_pg.runner.run_batches import RunBatches
from agora_pg.runner.schedule_listener import listen_for_schedule_changes
from agora_pg.runner.scheduled_pipeline import PipelineStatus, ScheduledPipeline, ScheduleStopped
from agora_pg.runner.scheduler import Scheduler
from agora_pg.runtime.database_calls import StopSignal
from agora_pg.runtime.leases import LeaseSupervisor, supervising
from agora_pg.runtime.process import check_schema, new_worker_id, warn_unknown_settings
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.worker import Worker

log = logging.getLogger("agora_pg.runner")

TERMINAL_STATES = {"stopped"}


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
    """The pool's job worker ended without being asked to; the pool shut down."""


class WorkerPool:
    """Runs every registered ScheduledPipeline, and a job ``Worker`` if one is
    registered, as concurrent asyncio tasks; the ticks of registered ``PeriodicJob``s are
    enqueued by the pool's ``Scheduler``. ``health_port`` starts a
    HealthServer (/health, /ready, /metrics) on ``health_host`` (loopback unless
    ``WORKER_HEALTH_HOST`` or this says otherwise); without it there is no server."""

    def __init__(
        self,
        health_port: int | None = None,
        graceful_shutdown_timeout: float = 30.0,
        *,
        settings: Settings | None = None,
        health_host: str = DEFAULT_HOST,
    ) -> None:
        if graceful_shutdown_timeout < 0:
            raise ValueError("graceful_shutdown_timeout must be >= 0")
        self.health_port = health_port
        self.health_host = health_host
        self.graceful_shutdown_timeout = graceful_shutdown_timeout
        self.settings = settings
        self.pipelines: list[ScheduledPipeline] = []
        self.periodic_jobs: list[PeriodicJob] = []
        self.job_worker: Worker | None = None
        self.scheduler: Scheduler | None = None
        self.health: HealthServer | None = None
        self._stopping = StopSignal()
        self._aborting = StopSignal()
        self._store: Store | None = None
        self._error_details = False

    def register(self, item: ScheduledPipeline | PeriodicJob | Worker) -> WorkerPool:
        """Add a ScheduledPipeline, a PeriodicJob or the job Worker; returns self for chaining."""
        if isinstance(item, Worker):
            if self.job_worker is not None:
                raise ValueError("a WorkerPool runs one job Worker; give it all the handlers")
            self.job_worker = item
        elif isinstance(item, ScheduledPipeline | PeriodicJob):
            if item.pipeline_id in {p.pipeline_id for p in self.pipelines} | {p.pipeline_id for p in self.periodic_jobs}:
                raise ValueError(f"pipeline_id {item.pipeline_id!r} is registered twice")
            if isinstance(item, PeriodicJob):
                self.periodic_jobs.append(item)
            else:
                self.pipelines.append(item)
        else:
            raise TypeError(f"register() takes a ScheduledPipeline, a PeriodicJob or a Worker, "
                            f"got {type(item).__name__}")
        return self

    def stop(self) -> None:
        """Begin a graceful shutdown."""
        self._stopping.set()
        if self.scheduler is not None:
            self.scheduler.wake()
        for pipeline in self.pipelines:
            pipeline.stop()
        if self.job_worker is not None:
            self.job_worker.stop()

    def abort(self) -> None:
        """Skip the graceful wait: cancel everything now."""
        self._aborting.set()
        if self.job_worker is not None:
            self.job_worker.abort()
        self.stop()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until shutdown; raises ``PipelineFailed`` if a pipeline stopped for errors
        (or ``JobWorkerStopped`` if the job worker ended on its own)."""
        warn_unknown_settings()
        settings = self.settings or load_settings(os.environ)
        if self.job_worker is not None:
            settings = self.job_worker.effective_settings()
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
                    await self._serve(store, settings)
                finally:
                    self._store = None
                    await store.close()

    async def _serve(self, store: Store, settings: Settings) -> None:
        worker_id = self.job_worker.id if self.job_worker is not None else new_worker_id()
        try:
            async with supervising(None, store.database, worker_id, settings) as supervisor:
                await self._serve_with(store, settings, worker_id, supervisor)
        finally:
            if self.pipelines and self.job_worker is None:  # (a job worker records its own stop)
                await self._record_stop(store, worker_id)

    async def _serve_with(self, store: Store, settings: Settings, worker_id: str, supervisor: LeaseSupervisor) -> None:
        if self.health_port is not None:  # first: a port in use stops the pool before anything runs
            self.health = HealthServer(self.health_port, self._live, self._ready, self.health_host, self._metrics)
            await self.health.start()
        tasks: dict[asyncio.Task[Any], ScheduledPipeline | Worker] = {}
        batches = RunBatches(store, worker_id, settings.lease_seconds)  # run claims and finishes, many per statement
        for pipeline in self.pipelines:
            serving = pipeline.serve(store, worker_id, settings, supervisor, batches)
            tasks[asyncio.create_task(serving, name=pipeline.pipeline_id)] = pipeline
        if self.job_worker is not None:
            worker_settings = settings.replace(shutdown_timeout=self.graceful_shutdown_timeout)
            serving = self.job_worker.serve(store, worker_settings, supervisor)
            tasks[asyncio.create_task(serving, name="jobs")] = self.job_worker
        sharing = (
            asyncio.create_task(batches.share_ticks(socket.gethostname(), os.getpid(), len(self.pipelines)),
                                name="tick-shares")
            if self.pipelines else None
        )
        scheduling = None
        if self.periodic_jobs:
            self.scheduler = Scheduler(store, worker_id, self.periodic_jobs)
            scheduling = asyncio.create_task(self.scheduler.run(self._stopping), name="scheduler")
        listener_stop = asyncio.Event()
        listener = (
            asyncio.create_task(listen_for_schedule_changes(store, self.pipelines, listener_stop, self.scheduler),
                                name="schedules")
            if (self.pipelines or self.periodic_jobs) and settings.notifications else None
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
            if sharing is not None:
                sharing.cancel()
                await asyncio.gather(sharing, return_exceptions=True)
            listener_stop.set()
            if listener is not None:
                await asyncio.wait([listener], timeout=5)
                listener.cancel()
            if self.health is not None:
                await self.health.close()
        if failure is not None:
            log.error("%s", failure)
            raise failure

    @staticmethod
    async def _record_stop(store: Store, worker_id: str) -> None:
        """A clean stop gives up the worker lease, so the peers take this process's share
        of the ticks at once (not once the lease has passed)."""
        try:
            await store.workers.stop(worker_id)
        except Exception as error:  # (in a finally: the error that stopped the pool, if any, stands)
            log.warning("recording the stop of %s failed (its lease will pass): %s", worker_id, error)

    async def _watch(self, tasks: dict[asyncio.Task[Any], ScheduledPipeline | Worker]) -> AgoraError | None:
        """Wait for a shutdown signal, the end of every task, or a terminal error."""
        failure: AgoraError | None = None
        stopper: asyncio.Task[Any] = asyncio.create_task(self._stopping.wait())
        pending: set[asyncio.Task[Any]] = set(tasks)
        try:
            while pending and not self._stopping.is_set():
                done, pending = await asyncio.wait(pending | {stopper}, return_when=asyncio.FIRST_COMPLETED)
                pending.discard(stopper)
                for task in done - {stopper}:
                    failure = self._terminal_error(tasks[task], task) or failure
                if failure is not None:
                    self.stop()
            if failure is None and self.periodic_jobs:  # their ticks go on until the pool is stopped
                await self._stopping.wait()
        finally:
            stopper.cancel()
        return failure

    def _terminal_error(self, owner: ScheduledPipeline | Worker, task: asyncio.Task[Any]) -> AgoraError | None:
        error = None if task.cancelled() else task.exception()
        if isinstance(owner, Worker):
            if self._stopping.is_set():
                return None
            log.error("the job worker stopped unexpectedly; shutting the pool down", exc_info=error)
            return JobWorkerStopped(f"the job worker stopped unexpectedly: {error!r}")
        if error is None:
            return None  # a once pipeline that completed
        if isinstance(error, ScheduleStopped):  # stopped before this start: the error says what to do
            return error
        if owner.status.state == "stopped":
            log.error("pipeline %s reached max_consecutive_errors; shutting the pool down", owner.pipeline_id)
            return PipelineFailed(owner.pipeline_id, owner.status.consecutive_errors, error)
        log.error("pipeline %s crashed; shutting the pool down", owner.pipeline_id, exc_info=error)
        return PipelineFailed(owner.pipeline_id, None, error)

    async def _shut_down(self, tasks: dict[asyncio.Task[Any], ScheduledPipeline | Worker]) -> None:
        self.stop()
        pending = await wait_tasks_or_event(tasks, self._aborting, self.graceful_shutdown_timeout)
        if pending:
            log.warning("graceful shutdown over; cancelling %s", sorted(task.get_name() for task in pending))
            if self.job_worker is not None and self._aborting.is_set():
                self.job_worker.abort()  # a second signal: it stops at once
            # (otherwise the job worker, whose grace period is this one, stops its running
            # jobs itself now and finishes its own bounded shutdown)
            for task in pending:
                if not isinstance(tasks[task], Worker):
                    task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _live(self) -> tuple[bool, dict[str, Any]]:
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
        from agora_pg.runtime.process_metrics import PROCESS_METRICS

        if self._store is None:
            raise DatabaseUnavailable("the pool is not running")
        return render_metrics(await self._store.metrics(), PROCESS_METRICS), CONTENT_TYPE

    def _statuses(self) -> dict[str, PipelineStatus]:
        """Every schedule this pool serves: its pipelines, then its periodic jobs."""
        statuses = {p.pipeline_id: p.status for p in self.pipelines}
        rows = self.scheduler.rows if self.scheduler is not None else {}
        for periodic in self.periodic_jobs:
            statuses[periodic.pipeline_id] = PipelineStatus.of(periodic.pipeline_id, rows.get(periodic.pipeline_id))
        return statuses

    def _pipeline_report(self) -> dict[str, Any]:
        return {pipeline_id: status.as_json(error_details=self._error_details)
                for pipeline_id, status in self._statuses().items()}
