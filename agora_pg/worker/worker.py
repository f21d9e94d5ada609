"""The job worker: claims due jobs, runs their handlers, records outcomes.

Side services run beside the claim loop and stop with it: the completer
(writes outcomes), the heartbeat (keeps leases alive), the job rescuer (takes
back jobs of lost workers) and the listener (LISTEN for new jobs).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

from agora_pg.db.connect import resolve_database
from agora_pg.db.migrate import head_revisions
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable, SchemaNotReady
from agora_pg.jobs import Job
from agora_pg.lifecycle import shutdown_signals, wait_for_event, wait_tasks_or_event
from agora_pg.retry import BackoffPolicy
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.completer import Completer, Outcome
from agora_pg.worker.dispatch import Handler, run_handler
from agora_pg.worker.job_rescuer import JobRescuer

log = logging.getLogger("agora_pg.worker")

Lifespan = Callable[[], AbstractAsyncContextManager[Any]]


class ErrorWait:
    """A pause between retries of a failing database call that doubles up to 10 s."""

    MAX_SECONDS = 10.0

    def __init__(self, first_seconds: float) -> None:
        self._first = first_seconds
        self._current = first_seconds

    def next(self) -> float:
        wait = self._current
        self._current = min(self._current * 2, self.MAX_SECONDS)
        return wait

    def reset(self) -> None:
        self._current = self._first


def new_worker_id() -> str:
    """Unique per process start: host and pid for people, a random part for uniqueness."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


class Worker:
    """Runs jobs from ``agora.jobs``: ``HANDLERS[job.kind](job, resources)``.

    A Worker instance runs once: after ``run()`` returns, build a new one.
    ``resources`` is handed to every handler as is; or give ``lifespan``, a
    function returning an async context manager whose value becomes the
    resources for the worker's lifetime (open clients at start, close at stop).
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        resources: Any = None,
        lifespan: Lifespan | None = None,
        settings: Settings | None = None,
    ) -> None:
        if resources is not None and lifespan is not None:
            raise ValueError("give resources or lifespan, not both")
        self.handlers = dict(handlers)
        self.resources = resources
        self.lifespan = lifespan
        self.settings = settings
        self.id = new_worker_id()
        self._overrides: dict[str, Any] = {}
        self._stopping = asyncio.Event()
        self._aborting = asyncio.Event()
        self._wakeup = asyncio.Event()  # set to make the claim loop look again at once

    def configure(self, *, queues: Sequence[str] | None = None, concurrency: int | None = None) -> Worker:
        """Override queues or concurrency (as the CLI's flags do); returns self."""
        if queues is not None:
            self._overrides["queues"] = tuple(queues)
        if concurrency is not None:
            self._overrides["concurrency"] = concurrency
        return self

    def stop(self) -> None:
        """Stop claiming; running jobs get ``shutdown_timeout`` seconds to finish."""
        self._stopping.set()
        self._wakeup.set()

    def abort(self) -> None:
        """Stop at once: running jobs are cancelled and released to pending."""
        self._aborting.set()
        self.stop()

    def effective_settings(self) -> Settings:
        """The settings this worker runs with: its own (or the environment's) plus overrides."""
        return (self.settings or load_settings(os.environ)).replace(**self._overrides)

    async def run(self, *, handle_signals: bool = True) -> None:
        """Run until ``stop()`` or SIGINT/SIGTERM; blocks."""
        settings = self.effective_settings()
        with shutdown_signals(self.stop, self.abort) if handle_signals else contextlib.nullcontext():
            async with resolve_database(settings) as database:
                store = Store.open(database, pool_size=4)
                try:
                    await check_schema(store)
                    await self.serve(store, settings)
                finally:
                    await store.close()

    async def serve(self, store: Store, settings: Settings) -> None:
        """Run on an open Store (as a ``WorkerPool`` does) until stopped."""
        async with self._resources() as resources:
            await _WorkerRun(self, store, settings, resources).serve()

    @contextlib.asynccontextmanager
    async def _resources(self) -> AsyncIterator[Any]:
        if self.lifespan is None:
            yield self.resources
            return
        async with self.lifespan() as resources:
            yield resources


async def check_schema(store: Store) -> None:
    """Raise ``SchemaNotReady`` unless the database is migrated to head."""
    applied = await store.schema_versions()
    head = head_revisions()
    if applied != head:
        state = "not migrated" if not applied else f"at {', '.join(sorted(applied))}"
        raise SchemaNotReady(
            f"the agora schema is {state}, expected {', '.join(sorted(head))}: "
            "run `agora-pg migrate` first"
        )


class _WorkerRun:
    """One run of a Worker: its claim loop and side services."""

    def __init__(self, worker: Worker, store: Store, settings: Settings, resources: Any) -> None:
        self.worker = worker
        self.store = store
        self.settings = settings
        self.resources = resources
        self.completer = Completer(
            store,
            worker.id,
            settings.max_retries,
            BackoffPolicy(settings.retry_backoff_seconds, settings.retry_backoff_max_seconds),
            random.Random(),
        )
        self.rescuer = JobRescuer(store, settings.max_retries)
        self.running: dict[int, tuple[Job, asyncio.Task[None]]] = {}
        self.side_tasks: list[asyncio.Task[None]] = []
        self.side_stop = asyncio.Event()

    async def serve(self) -> None:
        worker, settings = self.worker, self.settings
        await self.store.register_worker(worker.id, socket.gethostname(), os.getpid(), settings.queues)
        log.info(
            "worker %s started: queues=%s concurrency=%d notifications=%s",
            worker.id, ",".join(settings.queues), settings.concurrency,
            "on" if settings.notifications else "off",
        )
        self._start_side(self._completer_loop(), "completer")
        self._start_side(self._every(settings.lease_seconds / 3, self._heartbeat), "heartbeat")
        rescue_interval = min(max(settings.lease_seconds / 10, 0.5), 5.0)
        self._start_side(self._every(rescue_interval, self.rescuer.run_once), "job_rescuer")
        if settings.notifications:
            self._start_side(self._listen_loop(), "listener")
        try:
            await self._claim_loop()
        finally:
            await self._shutdown()

    # -- claiming ------------------------------------------------------------

    async def _claim_loop(self) -> None:
        worker, settings = self.worker, self.settings
        error_wait = ErrorWait(0.5)
        while not worker._stopping.is_set():
            worker._wakeup.clear()
            free = settings.concurrency - len(self.running)
            if free > 0:
                try:
                    jobs = await self.store.claim_jobs(settings.queues, free, worker.id, settings.lease_seconds)
                except DatabaseUnavailable as error:
                    wait = error_wait.next()
                    log.warning("claiming failed, retrying in %.1fs: %s", wait, error)
                    await wait_for_event(worker._stopping, wait)
                    continue
                error_wait.reset()
                for job in jobs:
                    task = asyncio.create_task(self._run_job(job), name=f"job-{job.id}")
                    self.running[job.id] = (job, task)
                if len(jobs) == free:
                    await asyncio.sleep(0)  # let finished handlers free their slots, then claim again
                    continue
            await wait_for_event(worker._wakeup, settings.poll_seconds)

    async def _run_job(self, job: Job) -> None:
        try:
            await run_handler(self.worker.handlers, job, self.resources)
        except asyncio.CancelledError:
            return  # released by _shutdown
        except Exception as error:
            log.info("job %s (%s) failed: %s: %s", job.id, job.kind, type(error).__name__, error)
            self.completer.add(Outcome(job, error))
        else:
            self.completer.add(Outcome(job))
        finally:
            self.running.pop(job.id, None)
            self.worker._wakeup.set()

    # -- side services ---------------------------------------------------------

    def _start_side(self, coroutine: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._side_done)
        self.side_tasks.append(task)

    def _side_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled() or task.exception() is None:
            return
        log.error("%s crashed; stopping the worker", task.get_name(), exc_info=task.exception())
        self.worker.stop()

    async def _every(self, interval: float, action: Callable[[], Coroutine[Any, Any, Any]]) -> None:
        while not self.side_stop.is_set():
            try:
                await action()
            except DatabaseUnavailable as error:
                log.warning("%s: %s", getattr(action, "__name__", "task"), error)
            await wait_for_event(self.side_stop, interval)

    async def _heartbeat(self) -> None:
        await self.store.heartbeat(self.worker.id, self.settings.lease_seconds)

    async def _completer_loop(self) -> None:
        error_wait = ErrorWait(0.2)
        while True:
            if not self.completer.pending_count:
                if self.side_stop.is_set():
                    return
                waiter = asyncio.create_task(self.completer.has_pending.wait())
                stopper = asyncio.create_task(self.side_stop.wait())
                await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                waiter.cancel()
                stopper.cancel()
                continue
            try:
                await self.completer.flush_once()
                error_wait.reset()
            except DatabaseUnavailable as error:
                wait = error_wait.next()
                log.warning("recording outcomes failed, retrying in %.1fs: %s", wait, error)
                await asyncio.sleep(wait)

    async def _listen_loop(self) -> None:
        queues = set(self.settings.queues)
        error_wait = ErrorWait(0.5)

        def on_queue(queue: str) -> None:
            if queue in queues:
                self.worker._wakeup.set()

        while not self.side_stop.is_set():
            try:
                listener = await self.store.listen(on_queue)
            except DatabaseUnavailable as error:
                wait = error_wait.next()
                log.warning("LISTEN failed, polling meanwhile; retrying in %.1fs: %s", wait, error)
                await wait_for_event(self.side_stop, wait)
                continue
            error_wait.reset()
            self.worker._wakeup.set()  # jobs may have arrived while not listening
            stopper = asyncio.create_task(self.side_stop.wait())
            watched: list[asyncio.Future[Any]] = [stopper, listener.closed]
            await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
            stopper.cancel()
            await listener.close()

    # -- shutdown ----------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let running jobs finish within the grace period, release the rest,
        record every outcome, then stop the side services."""
        worker = self.worker
        tasks = [task for _job, task in self.running.values()]
        if tasks and not worker._aborting.is_set():
            log.info("waiting up to %.0fs for %d running job(s)", self.settings.shutdown_timeout, len(tasks))
            await wait_tasks_or_event(tasks, worker._aborting, self.settings.shutdown_timeout)
        unfinished = list(self.running.values())
        for _job, task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.gather(*(task for _job, task in unfinished), return_exceptions=True)
        await self._drain_completer()
        if unfinished:
            attempts = [(job.id, job.attempt) for job, _task in unfinished]
            try:
                released = await self.store.release_jobs(attempts, worker.id)
                log.warning("released %d unfinished job(s) back to pending: %s", len(released), sorted(released))
            except DatabaseUnavailable as error:
                log.error("could not release unfinished jobs (their lease will expire): %s", error)
        self.side_stop.set()
        await asyncio.gather(*self.side_tasks, return_exceptions=True)
        with contextlib.suppress(DatabaseUnavailable):
            await self.store.stop_worker(worker.id)
        log.info("worker %s stopped", worker.id)

    async def _drain_completer(self) -> None:
        """Flush outcomes until none are left (bounded: leases expire anyway)."""
        deadline = asyncio.get_running_loop().time() + max(self.settings.lease_seconds, 5.0)
        while self.completer.pending_count and asyncio.get_running_loop().time() < deadline:
            try:
                await self.completer.flush_once()
            except DatabaseUnavailable as error:
                log.warning("recording outcomes at shutdown failed: %s", error)
                await asyncio.sleep(0.5)
