"""The job worker: claims due jobs, runs their handlers, records outcomes.

Side services run beside the claim loop and stop with it: the completer
(writes outcomes), the job rescuer (takes back jobs of lost workers), the
promoter (moves delayed jobs into the claim index once due) and the listener
(LISTEN for new jobs, new delayed jobs and cancels of running ones). Leases are
renewed by the process's ``LeaseSupervisor``, which also stops attempts whose
lease is lost or cannot be renewed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import socket
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

from agora_pg.db import queries
from agora_pg.db.connect import resolve_database
from agora_pg.db.store import NOTIFY_CHANNEL, Store
from agora_pg.errors import DatabaseUnavailable, HandlerThreadStuck
from agora_pg.jobs import Job
from agora_pg.lifecycle import shutdown_signals, wait_for_event, wait_tasks_or_event
from agora_pg.limits import KindLimit, QueueLimit
from agora_pg.logs import Repeated
from agora_pg.outcomes import Outcome, StopReason, thread_left_running
from agora_pg.runtime.database_calls import StopSignal, Stopped, listen_until, retry_database, unless_stopped
from agora_pg.runtime.leases import LeaseSupervisor, supervising
from agora_pg.runtime.process import ErrorWait, check_schema, new_worker_id, warn_unknown_settings
from agora_pg.runtime.process_metrics import PROCESS_METRICS, TALLIES, StuckThread
from agora_pg.settings import Settings, load_settings
from agora_pg.worker.attempts import DEFAULT_OPTIONS, Attempt, run_attempt
from agora_pg.worker.completer import Completer
from agora_pg.worker.context import ProgressReporter
from agora_pg.worker.handlers import Handler, Handlers, handler_name, is_async_handler
from agora_pg.worker.job_rescuer import JobRescuer

log = logging.getLogger("agora_pg.worker")
GAVE_BACK = Repeated(log, logging.INFO)

Lifespan = Callable[[], AbstractAsyncContextManager[Any]]
T = TypeVar("T")

TIMEOUT_SWEEP_SECONDS = 0.1  # how often running attempts are checked against their deadline
ABORT_STEP_SECONDS = 1.0  # after a second signal, unrecorded outcomes get this long, then are left
PIPELINED_ABOVE = 100  # concurrency above which a claim takes at most half the slots
# Concurrency up to which the call that records a batch's successes also claims the slots
# they free (agora.complete_and_claim): its commit saved is what a small worker waits for
# (drains 2.33x at 1 slot, 1.57x at 10, 1.16x at 100); above, a claim beside each write
# of outcomes drains faster (0.80x at 500 with both in one call, as first measured).
OUTCOMES_CLAIM_UP_TO = PIPELINED_ABOVE
LIMITS_REFRESH_SECONDS = 5.0  # how often a worker reads which of its kinds have a limit
# Of a kind taken key by key, a limited claim looks for jobs without a key among the first
# max(LIMITED_SCAN, LIMITED_SCAN_PER_SLOT x slots asked) due jobs of each of its queues.
LIMITED_SCAN = 100
LIMITED_SCAN_PER_SLOT = 4
RATE_ROOM_MARGIN = 0.002  # wake this long after a rate limit's window has room
TALLIES_EVERY_SECONDS = 10.0  # how often the process's counters are published (agora.process_tallies)
PROMOTE_BATCH = 1000  # delayed jobs promoted per statement
PROMOTE_MIN_INTERVAL = 0.1  # seconds between a worker's promotions while delayed jobs keep falling due
PROMOTE_MARGIN = 0.002  # wake this long after the next delayed job falls due


def claim_batch(concurrency: int) -> int:
    """The most jobs one claim takes. Above ``PIPELINED_ABOVE`` slots, half of them: while
    one half's outcomes are being written, the other half is claimed and run (two
    connections at work; +29 % drain rate at 500). Below, every free slot: a statement
    saved counts more than the overlap (halving cost 10 % at 50, nothing at 100)."""
    if concurrency <= PIPELINED_ABOVE:
        return concurrency
    return max(PIPELINED_ABOVE, -(-concurrency // 2))


class Worker:
    """Runs jobs from ``agora.jobs``: ``HANDLERS[job.kind](job, resources)``.

    ``handlers`` is a dict of kind to handler, or a ``Handlers`` table (which also
    carries per-kind timeouts and non-retryable errors). A Worker instance runs
    once: after ``run()`` returns, build a new one. ``resources`` is handed to every
    handler as is; or give ``lifespan``, a function returning an async context
    manager whose value becomes the resources for the worker's lifetime (open
    clients at start, close at stop). ``queues`` and ``concurrency`` override the
    settings' (``WORKER_QUEUES``, ``WORKER_CONCURRENCY``), as the CLI's flags do.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler],
        *,
        resources: Any = None,
        lifespan: Lifespan | None = None,
        settings: Settings | None = None,
        queues: Sequence[str] | None = None,
        concurrency: int | None = None,
    ) -> None:
        if resources is not None and lifespan is not None:
            raise ValueError("give resources or lifespan, not both")
        self.handlers = dict(handlers)
        self.kind_options = {kind: handlers.options(kind) for kind in handlers} if isinstance(handlers, Handlers) else {}
        self.queue_limits = handlers.queue_limits() if isinstance(handlers, Handlers) else {}
        self.async_kinds = {kind for kind, handler in self.handlers.items() if is_async_handler(handler)}
        self.resources = resources
        self.lifespan = lifespan
        self.settings = settings
        self.id = new_worker_id()
        self._overrides: dict[str, Any] = {}
        self._stopping = StopSignal()
        self._aborting = StopSignal()
        self._wakeup = asyncio.Event()  # set to make the claim loop look again at once
        self.configure(queues=queues, concurrency=concurrency)

    def configure(self, *, queues: Sequence[str] | None = None, concurrency: int | None = None) -> Worker:
        """Override queues or concurrency (as the CLI's flags do, and ``Worker(queues=...,
        concurrency=...)``); returns self."""
        if queues is not None:
            if isinstance(queues, str) or not queues or not all(isinstance(q, str) and q.strip() for q in queues):
                raise ValueError(f"queues takes a list of queue names, such as ['default', 'mail'], got {queues!r}")
            self._overrides["queues"] = tuple(queues)
        if concurrency is not None:
            if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
                raise ValueError(f"concurrency must be a whole number >= 1, got {concurrency!r}")
            self._overrides["concurrency"] = concurrency
        return self

    def clone(self) -> Worker:
        """A new worker with this one's handlers, kind options, resources, lifespan, settings
        and overrides, and an id and stop signals of its own (a stopped worker stays stopped)."""
        twin = Worker(self.handlers, resources=self.resources, lifespan=self.lifespan, settings=self.settings)
        twin.kind_options = dict(self.kind_options)
        twin.queue_limits = dict(self.queue_limits)
        twin._overrides = dict(self._overrides)
        return twin

    def wake(self) -> None:
        """Look for due jobs now (jobs fell due that no notification announces)."""
        self._wakeup.set()

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
        warn_unknown_settings()
        settings = self.effective_settings()
        with shutdown_signals(self.stop, self.abort) if handle_signals else contextlib.nullcontext():
            async with resolve_database(settings) as database:
                store = Store.open(database, pool_size=4, timeout=settings.database_timeout)
                try:
                    await check_schema(store)
                    await self.serve(store, settings)
                finally:
                    await store.close()

    async def serve(self, store: Store, settings: Settings, supervisor: LeaseSupervisor | None = None) -> None:
        """Run on an open Store (as a ``WorkerPool`` does) until stopped; leases are renewed
        by ``supervisor`` (the pool's), else by a supervisor of the worker's own."""
        async with supervising(supervisor, store.database, self.id, settings) as leases:
            async with self._resources() as resources:
                await _WorkerRun(self, store, settings, resources, leases).serve()

    @contextlib.asynccontextmanager
    async def _resources(self) -> AsyncIterator[Any]:
        if self.lifespan is None:
            yield self.resources
            return
        async with self.lifespan() as resources:
            yield resources


class _WorkerRun:
    """One run of a Worker: its claim loop and side services."""

    def __init__(
        self, worker: Worker, store: Store, settings: Settings, resources: Any, supervisor: LeaseSupervisor
    ) -> None:
        self.worker = worker
        self.store = store
        self.settings = settings
        self.resources = resources
        self.supervisor = supervisor
        self.completer = Completer(store, worker.id, settings, supervisor, random.Random(),
                                   on_settled=self._outcomes_settled, claimer=self.complete_and_claim)
        self.progress = ProgressReporter(store, worker.id)
        self.rescuer = JobRescuer(store, settings.max_lost_attempts, settings.max_retries,
                                  lease_seconds=settings.lease_seconds)
        self.running: set[Attempt] = set()  # by identity, not job id: a job may come back to this worker
        self.suspects_running = 0  # attempts of suspects (at most one is claimed at a time)
        self.silent_at_shutdown = False  # a database step at shutdown got no answer: the later ones are skipped
        # A job that lost this many attempts is a suspect (it may be what kills workers): one
        # below the most it may lose, so that a job that kills its process, run beside the
        # same neighbours until it becomes one, never takes them to their limit.
        self.suspect_lost = max(1, settings.max_lost_attempts - 1)
        self.known_kinds = tuple(worker.handlers)
        self.side_tasks: list[asyncio.Task[None]] = []
        self.given_up: list[Attempt] = []  # attempts whose sync handler's thread was given up
        self.side_stop = StopSignal()
        self.claim_unsure_until = 0.0  # a claim's reply was lost: look for jobs held unknowingly
        self.unknown_seen = False  # the lease supervisor saw jobs held unknowingly: look once
        self.delayed_inserted = asyncio.Event()  # new delayed jobs: the promoter looks again
        self.claim_batch = claim_batch(settings.concurrency)
        self.claim_timeout = min(settings.claim_timeout, settings.lease_seconds / 2)  # (cancelled past it)
        self.limited_kinds: tuple[str, ...] = ()  # of known_kinds, those with a limit
        self.rated_kinds: tuple[str, ...] = ()  # of those, the ones with a rate limit
        self.limits_read_at = -LIMITS_REFRESH_SECONDS
        self.rate_wake: asyncio.TimerHandle | None = None  # wakes the claim loop when a rate window has room
        self.fair_cursor: str | None = None  # the last key of fair share served: the next claim starts after it
        self.limited_queues: tuple[str, ...] = ()  # of its queues, those with limits
        self.rated_queues: tuple[str, ...] = ()  # and of those, the ones with a rate limit
        self.unlimited_queues, self.unlimited_kinds = settings.queues, self.known_kinds  # (until limits are read)
        # the flow control its handlers declare (every kind it handles: one without any has its row removed)
        self.code_limits = {kind: options.limit() for kind, options in worker.kind_options.items()}

    async def serve(self) -> None:
        worker, settings = self.worker, self.settings
        limits = self.code_limits

        async def register() -> None:  # (its statements are idempotent: a retry runs them again)
            await self.store.workers.register(worker.id, socket.gethostname(), os.getpid(), settings.queues,
                                              self.known_kinds)
            if worker.kind_options:
                declared = {kind: options.declared() for kind, options in worker.kind_options.items()}
                for conflict in await self.store.workers.declare_kinds(worker.id, declared):
                    log.warning("kind %r: this worker declares %s, live worker %s declared %s: this worker's "
                                "options apply from now on (the latest worker to start wins)", conflict.kind,
                                conflict.declares, conflict.worker_id, conflict.holds)
            if limits:
                await self.store.jobs.declare_limits(limits)
            if worker.queue_limits:
                await self.store.jobs.declare_queue_limits(worker.queue_limits)

        try:
            await retry_database(register, what="registering the worker", stop=worker._stopping)
        except Stopped:  # stopped before it started: nothing was claimed, nothing to wait for
            log.info("worker %s stopped before it registered", worker.id)
            return
        log.info(
            "worker %s started: queues=%s concurrency=%d notifications=%s",
            worker.id, ",".join(settings.queues), settings.concurrency,
            "on" if settings.notifications else "off",
        )
        for kind, options in sorted(worker.kind_options.items()):
            if options.queue is not None and options.queue not in settings.queues:
                log.warning("kind %r enqueues into queue %r, which this worker does not claim (queues=%s): "
                            "run a worker with --queues %s", kind, options.queue, ",".join(settings.queues),
                            ",".join((*settings.queues, options.queue)))
        self._start_side(self._completer_loop(), "completer")
        self._start_side(self._enforce_timeouts(), "timeouts")
        self._start_side(self.progress.run(self.side_stop), "progress")
        self._start_side(self._promote_loop(), "promoter")
        rescue_interval = min(max(settings.lease_seconds / 10, 0.5), 5.0)
        self._start_side(self._every(rescue_interval, self.rescuer.run_once, "rescuing jobs of lost workers"),
                         "job_rescuer")
        if settings.retention is not None:
            self._start_side(self._every(settings.prune_interval, self._prune, "pruning finished history"), "pruner")
        self._start_side(self._every(TALLIES_EVERY_SECONDS, self._publish_tallies, "publishing counters"), "tallies")
        if settings.notifications:
            channels = {
                NOTIFY_CHANNEL: self._on_enqueue,
                queries.DELAYED_CHANNEL: lambda _: self.delayed_inserted.set(),
                queries.CANCEL_CHANNEL: self._on_cancel,
            }
            self._start_side(
                listen_until(self.store, channels, self.side_stop, self._look_again, "LISTEN for new jobs"),
                "listener",
            )
        self.supervisor.on_unknown_jobs = self._on_unknown_jobs
        try:
            await self._claim_loop()
        finally:
            self.supervisor.on_unknown_jobs = None
            await self._shutdown()
        if self.given_up:
            raise HandlerThreadStuck(self._stuck_message())

    # -- claiming ------------------------------------------------------------

    async def _claim_loop(self) -> None:
        worker, settings = self.worker, self.settings
        pause = ErrorWait(0.5)
        while not worker._stopping.is_set():
            worker._wakeup.clear()
            try:
                if self.unknown_seen or time.monotonic() < self.claim_unsure_until:
                    self.unknown_seen = False
                    await self._adopt_unknown()
                # A slot is free once its attempt's outcome is written, not when its handler
                # returns: memory and unrecorded work stay bounded by the concurrency.
                free = settings.concurrency - len(self.running) - self.completer.unrecorded
                if free > 0:
                    limit = min(free, self.claim_batch)
                    claimed_at = time.monotonic()
                    had_suspect = self.suspects_running
                    jobs = await self._claim(limit)
                    pause.reset()
                    self._start(await self._one_suspect_at_most(jobs), claimed_at)
                    # (a claim that took a suspect left the others behind it: the next reads past them)
                    if len(jobs) == limit or (self.suspects_running and not had_suspect):
                        await asyncio.sleep(0)  # let finished handlers free their slots, then claim again
                        continue
            except _Stopping:
                return
            except Exception as error:  # the claim loop never ends on an error: it waits and looks again
                if isinstance(error, DatabaseUnavailable):
                    self.claim_unsure_until = time.monotonic() + settings.lease_seconds
                await wait_for_event(worker._stopping, pause.after(error, "claiming jobs", log))
                continue
            await wait_for_event(worker._wakeup, settings.poll_seconds)

    async def _claim(self, limit: int) -> list[Job]:
        """Up to ``limit`` due jobs: first those a limit applies to (of its limited kinds,
        in any queue, and any in its limited queues: one statement keeps every limit), then
        of its other kinds in its other queues. If the second claim fails after the first
        claimed jobs, those run."""
        worker, settings = self.worker, self.settings
        if time.monotonic() - self.limits_read_at >= LIMITS_REFRESH_SECONDS:
            await self._unless_stopping(self._read_limits())  # (a stop does not wait for it)
        jobs: list[Job] = []
        if self.limited_kinds or self.limited_queues:
            jobs, self.fair_cursor = await self._unless_stopping(self.store.jobs.claim_limited(
                settings.queues, limit, worker.id, settings.lease_seconds, self.known_kinds,
                scan=max(LIMITED_SCAN, LIMITED_SCAN_PER_SLOT * limit), after_key=self.fair_cursor,
                timeout=self.claim_timeout))
        queues, kinds = self.unlimited_queues, self.unlimited_kinds
        if len(jobs) < limit and queues and kinds:
            suspects = not self.suspects_running and not any(job.lost_count >= self.suspect_lost for job in jobs)
            try:
                jobs += await self._unless_stopping(self.store.jobs.claim(
                    queues, limit - len(jobs), worker.id, settings.lease_seconds, kinds=kinds,
                    suspects=suspects, suspect_lost=self.suspect_lost, timeout=self.claim_timeout))
            except _Stopping:
                raise
            except Exception as error:  # the first claim committed: its jobs run, the rest is claimed later
                if not jobs:
                    raise
                log.warning("claiming jobs: %s; running the %d claimed before", error, len(jobs))
        if len(jobs) < limit and (self.rated_kinds or self.rated_queues):
            await self._wake_at_rate_room()
        return jobs

    async def complete_and_claim(self, successes: list[tuple[int, int]], results: dict[int, str]) -> set[int] | None:
        """Record successes and claim the slots they free in one call (the completer's
        ``Claimer``; the ids recorded): the plain claim of those slots (the claim loop
        takes the others, beside it), with no suspect (the claim loop's may), for a worker
        none of whose kinds or queues has a limit, when none may have been lost, up to
        ``OUTCOMES_CLAIM_UP_TO`` slots; otherwise None, nothing done. A call that failed
        may have committed with its reply lost: the worker looks for jobs it holds
        unknowingly for a lease."""
        settings, worker = self.settings, self.worker
        if (settings.concurrency > OUTCOMES_CLAIM_UP_TO or worker._stopping.is_set() or self.limited_kinds
                or self.limited_queues or self.unknown_seen or time.monotonic() < self.claim_unsure_until
                or time.monotonic() - self.limits_read_at >= LIMITS_REFRESH_SECONDS):
            return None
        claimed_at = time.monotonic()
        try:
            written, jobs = await self.store.jobs.complete_and_claim(
                successes, worker.id, results, queues=settings.queues, kinds=self.known_kinds,
                limit=min(len(successes), self.claim_batch), lease_seconds=settings.lease_seconds, suspects=False,
                suspect_lost=self.suspect_lost, timeout=self.claim_timeout)
        except (DatabaseUnavailable, asyncio.CancelledError):
            self.claim_unsure_until = time.monotonic() + settings.lease_seconds
            raise
        finally:
            worker._wakeup.set()
        if jobs and not worker._stopping.is_set():  # (once it stops, its shutdown gives them back)
            self._start(jobs, claimed_at)
        return written

    async def _read_limits(self) -> None:
        """Which of this worker's kinds and queues have limits (any worker or config
        declared); the code's own declared again where a config released its row."""
        worker, jobs = self.worker, self.store.jobs
        limited = await jobs.limited_kinds(self.known_kinds)
        if {kind for kind, limit in self.code_limits.items() if limit != KindLimit()} - limited.keys():
            await jobs.declare_limits(self.code_limits)
            limited = await jobs.limited_kinds(self.known_kinds)
        self.limited_kinds = tuple(sorted(limited))
        self.rated_kinds = tuple(sorted(kind for kind, rated in limited.items() if rated))
        queues = self.settings.queues
        queue_limits = await jobs.limited_queues(queues)
        declared = {queue for queue, limits in worker.queue_limits.items() if limits != QueueLimit() and queue in queues}
        if declared - queue_limits.keys():
            await jobs.declare_queue_limits(worker.queue_limits)
            queue_limits = await jobs.limited_queues(queues)
        self.limited_queues = tuple(queue for queue in queues if queue in queue_limits)
        self.rated_queues = tuple(queue for queue in self.limited_queues if queue_limits[queue].rate)
        # (the plain claim's; a kind whose limit was removed joins it when the limits are next read)
        self.unlimited_queues = tuple(queue for queue in queues if queue not in self.limited_queues)
        self.unlimited_kinds = tuple(kind for kind in self.known_kinds if kind not in self.limited_kinds)
        self.limits_read_at = time.monotonic()

    async def _wake_at_rate_room(self) -> None:
        """Look again when a rate limit's window next has room, if that is before the next poll
        (a job held back by a rate limit starts when its window opens, not a poll later)."""
        room_in = await self.store.jobs.next_rate_room(self.rated_kinds, self.rated_queues)
        if self.rate_wake is not None:
            self.rate_wake.cancel()
            self.rate_wake = None
        if room_in is not None and room_in < self.settings.poll_seconds:
            self.rate_wake = asyncio.get_running_loop().call_later(
                max(room_in, 0.0) + RATE_ROOM_MARGIN, self.worker._wakeup.set)

    async def _unless_stopping(self, call: Coroutine[Any, Any, T]) -> T:
        """Await ``call`` unless the worker stops first (a claim then counts as unsure)."""
        try:
            return await unless_stopped(call, self.worker._stopping)
        except Stopped:
            self.claim_unsure_until = time.monotonic() + self.settings.lease_seconds
            raise _Stopping() from None

    async def _one_suspect_at_most(self, jobs: list[Job]) -> list[Job]:
        """Keep at most one suspect (``suspect_lost`` lost attempts or more: it may be what
        kills workers) running here at a time; the others go back at once, uncounted. (The
        plain claim takes one at most already: this is for the limited claim's and adopted
        jobs.)"""
        suspects = [job for job in jobs if job.lost_count >= self.suspect_lost]
        keep = 0 if self.suspects_running else 1
        if len(suspects) <= keep:
            return jobs
        extra = suspects[keep:]
        try:
            await self.store.jobs.release_claimed(self.worker.id, [(job.id, job.attempt) for job in extra])
        except DatabaseUnavailable:  # (the lease supervisor finds them held here unknowingly: given back later)
            log.warning("could not give back %d job(s) with lost attempts: %s", len(extra), [j.id for j in extra])
        else:
            GAVE_BACK.log("gave back %d job(s) with lost attempts (one runs here at a time): %s",
                          len(extra), [job.id for job in extra])
        given_back = {id(job) for job in extra}
        return [job for job in jobs if id(job) not in given_back]

    async def _adopt_unknown(self) -> None:
        """Run the jobs this worker holds without knowing it: a claim that committed but
        whose reply was lost (or arrived after the call gave up)."""
        claimed_at = time.monotonic()
        jobs = await self.store.jobs.adopt_unknown(self.worker.id, self._held_job_ids(), self.settings.lease_seconds)
        if jobs:
            log.warning("found %d job(s) claimed by a call whose reply was lost; running them: %s",
                        len(jobs), [job.id for job in jobs])
            self._start(await self._one_suspect_at_most(jobs), claimed_at)

    def _on_unknown_jobs(self, job_ids: frozenset[int]) -> None:
        """The lease supervisor saw jobs held in this worker's name that it does not run: adopt them."""
        log.debug("jobs %s are held in this worker's name but not running here; looking them up", sorted(job_ids))
        self.unknown_seen = True
        self.worker._wakeup.set()

    def _held_job_ids(self) -> list[int]:
        """The jobs this worker knows it holds: running, or finished with the outcome not yet recorded."""
        return sorted({token.job_id for token in self.supervisor.held_tokens()})

    def _start(self, jobs: Iterable[Job], claimed_at: float) -> None:
        worker, settings = self.worker, self.settings
        attempts = []
        for job in jobs:
            options = worker.kind_options.get(job.kind, DEFAULT_OPTIONS)
            timeout = job.timeout_seconds or options.timeout or settings.job_timeout
            attempt = Attempt(
                job, worker.handlers.get(job.kind), job.kind in worker.async_kinds, options, timeout,
                deadline=None if timeout is None else claimed_at + timeout,
                reporter=self.progress, claimed_at=claimed_at,
            )
            attempt.task = asyncio.create_task(self._run(attempt), name=f"job-{job.id}")
            self.running.add(attempt)
            if job.lost_count >= self.suspect_lost:
                self.suspects_running += 1
            attempts.append(attempt)
        own_lease = [attempt for attempt in attempts if attempt.job.lease_expires_at is not None]
        if own_lease:
            self.supervisor.hold(own_lease, claimed_at)
        if len(own_lease) < len(attempts):
            self.supervisor.hold([a for a in attempts if a.job.lease_expires_at is None], claimed_at, worker_lease=True)

    async def _run(self, attempt: Attempt) -> Outcome | None:
        try:
            outcome = await run_attempt(attempt, self.resources)
            if outcome is not None and attempt.given_up:
                outcome = thread_left_running(outcome, attempt.thread_name, self.settings.lease_seconds,
                                              retry_at_least=shutdown_bound(self.settings))
            if outcome is not None and self.progress.has_pending(attempt.job.id, attempt.job.attempt):
                await self.progress.flush(attempt.job.id, attempt.job.attempt)
            if outcome is not None:
                if outcome.retry_after is not None:  # a planned Retry: one line, no traceback
                    log.info("%s asked to be retried in %gs: %s", attempt.description, outcome.retry_after,
                             outcome.error_message)
                elif outcome.traceback is not None:  # (a Fail: one line, its traceback in its run)
                    log.warning("%s failed: %s%s", attempt.description, outcome.error_message,
                                "" if outcome.intended else "\n" + outcome.traceback)
                attempt.outcome = outcome
                attempt.ended_at = time.monotonic()
                self.completer.add(attempt)
            return outcome
        finally:
            if not attempt.in_thread or attempt.given_up:
                self.running.discard(attempt)
                if attempt.job.lost_count >= self.suspect_lost and attempt.outcome is None:
                    self.suspects_running -= 1  # (one with an outcome counts until it is written)
                # The outcome may wait a while to be written: let the task (and its context)
                # go now rather than keep thousands alive for the garbage collector to scan.
                attempt.task = None
            self.worker._wakeup.set()

    def _outcomes_settled(self, attempts: list[Attempt]) -> None:
        """Suspects whose outcome is written (or taken over) no longer count as running
        here. Until then a suspect whose handler returned is still at risk: a job that
        kills the process would take its unwritten outcome with it and charge it a lost
        attempt, so a second suspect is not claimed beside it."""
        self.suspects_running -= sum(1 for attempt in attempts if attempt.job.lost_count >= self.suspect_lost)

    async def _enforce_timeouts(self) -> None:
        """Stop attempts past their deadline (one sweep every ``TIMEOUT_SWEEP_SECONDS``
        costs less than a timer per job); give up sync handlers' threads a lease later."""
        ceiling = self.settings.lease_seconds
        while not self.side_stop.is_set():
            now = time.monotonic()
            for attempt in list(self.running):
                if attempt.deadline is None or now < attempt.deadline:
                    continue
                if attempt.stop_reason is None:
                    attempt.stop(StopReason.TIMEOUT)
                elif attempt.in_thread and not attempt.given_up and now >= attempt.deadline + ceiling:
                    self._give_up_thread(attempt)
            await wait_for_event(self.side_stop, TIMEOUT_SWEEP_SECONDS)

    def _give_up_thread(self, attempt: Attempt) -> None:
        """A sync handler's thread still running a lease after its attempt's deadline cannot
        be stopped: record the attempt as it was stopped (its retry waits until this process
        has gone), free its slot, name the thread in /metrics and the health answer, and stop
        the worker so that the process is restarted (``HandlerThreadStuck``)."""
        assert attempt.task is not None and attempt.thread_result is not None and attempt.deadline is not None
        assert attempt.handler is not None  # (only a handler runs in a thread)
        attempt.given_up = True
        self.given_up.append(attempt)
        name = attempt.thread_name
        PROCESS_METRICS.thread_stuck(StuckThread(name, attempt.job.id, attempt.job.kind,
                                                 handler_name(attempt.handler), attempt.deadline))

        def returned(result: asyncio.Future[Any]) -> None:
            PROCESS_METRICS.thread_returned(name)
            failed = result.exception() if not result.cancelled() else None
            log.warning("%s: its thread returned at last%s; the attempt stays recorded as stopped",
                        attempt.description, f" (raising {type(failed).__name__})" if failed else "")

        attempt.thread_result.add_done_callback(returned)
        log.error("%s: its thread %s is still running a lease (%gs) past the attempt's deadline; recording "
                  "the attempt, leaving the thread, and stopping this worker so that its process is restarted",
                  attempt.description, name, self.settings.lease_seconds)
        attempt.task.cancel()
        self.worker.stop()

    def _stuck_message(self) -> str:
        threads = ", ".join(f"{a.thread_name} (job {a.job.id}, kind {a.job.kind!r})" for a in self.given_up)
        return (f"a sync handler's thread did not return a lease ({self.settings.lease_seconds:g}s) after its "
                f"attempt's deadline: {threads}; the attempt was recorded and the worker stopped: restart the "
                "process (the only way to end the thread)")

    def _look_again(self) -> None:
        """(Re)connected to LISTEN: notifications sent meanwhile are lost, so look at the tables
        (new jobs, delayed ones, and cancels of the jobs running here)."""
        self.worker._wakeup.set()
        self.delayed_inserted.set()
        if self.running:
            self._start_side(self._look_for_cancels([attempt.job.id for attempt in self.running]), "cancel check")

    async def _look_for_cancels(self, job_ids: list[int]) -> None:
        with contextlib.suppress(DatabaseUnavailable):  # (the next lease renewal carries them then)
            for job_id in await self.store.jobs.cancel_requested(job_ids):
                self._on_cancel(str(job_id))

    def _on_enqueue(self, queue: str) -> None:
        if queue in self.settings.queues:
            self.worker._wakeup.set()

    def _on_cancel(self, payload: str) -> None:
        for attempt in list(self.running):
            if str(attempt.job.id) == payload:
                attempt.stop(StopReason.CANCEL_REQUESTED)

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

    async def _publish_tallies(self) -> None:
        await TALLIES.publish(self.store.workers)

    async def _prune(self) -> None:
        """One pruning round (``AGORA_PG_PRUNE_AFTER``); another process pruning now is fine."""
        assert self.settings.retention is not None
        report = await self.store.prune(self.settings.retention)
        if report.jobs or report.pipeline_runs or report.dead_letters:
            log.info("pruned finished history: %d jobs with their runs, %d pipeline runs, %d dead letters",
                     report.jobs, report.pipeline_runs, report.dead_letters)

    async def _every(self, interval: float, action: Callable[[], Coroutine[Any, Any, Any]], what: str) -> None:
        while not self.side_stop.is_set():
            try:
                await unless_stopped(action(), self.side_stop)
            except Stopped:
                return
            except DatabaseUnavailable as error:
                log.warning("%s: %s", what, error)
            except Exception:  # a side service never ends on an error
                log.exception("%s failed", what)
            await wait_for_event(self.side_stop, interval)

    async def _promote_loop(self) -> None:
        """Promote delayed jobs into the claim index as they fall due: sleep until the
        earliest (by the database's clock, at least ``PROMOTE_MIN_INTERVAL``, at most
        ``poll_seconds``, sooner when new delayed jobs are announced), promote, repeat."""
        loop = asyncio.get_running_loop()
        pause = ErrorWait(0.5)
        while not self.side_stop.is_set():
            self.delayed_inserted.clear()
            try:
                promotion = await unless_stopped(self.store.jobs.promote_due(PROMOTE_BATCH), self.side_stop)
                promoted_at = loop.time()
                pause.reset()
                if promotion.promoted:
                    self.worker._wakeup.set()
                if promotion.promoted == PROMOTE_BATCH:
                    continue
                wait = self.settings.poll_seconds
                if promotion.next_in_seconds is not None:
                    # (a moment after it, by the database's clock: a look a moment early finds
                    # nothing due, and the next may not come before PROMOTE_MIN_INTERVAL)
                    wait = min(promotion.next_in_seconds + PROMOTE_MARGIN, wait)
                await unless_stopped(wait_for_event(self.delayed_inserted, wait), self.side_stop)
                # (announcements of delayed jobs never make it run more often than this)
                rest = promoted_at + PROMOTE_MIN_INTERVAL - loop.time()
                if rest > 0:
                    await unless_stopped(asyncio.sleep(rest), self.side_stop)
            except Stopped:
                return
            except Exception as error:  # never ends on an error: waits and looks again
                await wait_for_event(self.side_stop, pause.after(error, "promoting delayed jobs", log))

    async def _completer_loop(self) -> None:
        pause = ErrorWait(0.2)
        while True:
            if not self.completer.pending_count:
                if self.side_stop.is_set():
                    return
                with contextlib.suppress(Stopped):
                    await unless_stopped(self.completer.has_pending.wait(), self.side_stop)
                continue
            if self.side_stop.is_set():
                return  # the final flushes are the shutdown's
            try:
                # A flush in flight when the worker stops is given up (its outcomes stay
                # pending) and done again by the shutdown's drain, within its own deadline.
                await unless_stopped(self.completer.flush_once(), self.side_stop)
                pause.reset()
                self.worker._wakeup.set()  # their slots are free
            except Stopped:
                return
            except DatabaseUnavailable as error:
                await wait_for_event(self.side_stop, pause.after(error, "recording outcomes", log))

    # -- shutdown ----------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Let running jobs finish within the grace period, stop the rest (a sync handler's
        thread cannot be stopped: its job is left held), record every outcome, give back
        jobs claimed but never started, then stop the side services. Every database step
        is bounded; after a second signal only outcomes are written, for at most
        ``ABORT_STEP_SECONDS``."""
        worker = self.worker
        tasks = [attempt.task for attempt in self.running if attempt.task is not None]
        if tasks and not worker._aborting.is_set():
            log.info("waiting up to %.0fs for %d running job(s)", self.settings.shutdown_timeout, len(tasks))
            await wait_tasks_or_event(tasks, worker._aborting, self.settings.shutdown_timeout)
        for attempt in list(self.running):
            attempt.stop(StopReason.SHUTDOWN)
        if tasks:
            await asyncio.wait(tasks, timeout=5)
        self.side_stop.set()
        await asyncio.gather(*self.side_tasks, return_exceptions=True)
        await self._drain_completer()
        for attempt in self.running:
            if attempt.in_thread:
                log.warning("%s is still running in its thread: left as it is, not released; once this "
                            "process exits its lease expires and the job is rescued", attempt.description)
        if worker._aborting.is_set():  # stopping at once: leases expire, the worker row goes quiet
            log.info("worker %s stopped at once", worker.id)
            return
        await self._bounded(
            self.store.jobs.release_unstarted(worker.id, self._held_job_ids()),
            "giving back jobs claimed but not started",
        )
        await self._bounded(self.store.workers.stop(worker.id), "recording the worker's stop")
        await self._bounded(self._publish_tallies(), "publishing counters")
        log.info("worker %s stopped", worker.id)

    async def _bounded(self, call: Coroutine[Any, Any, Any], what: str) -> None:
        """A database step at shutdown: within the deadline, and given up at a second signal
        or once a step before got no answer (each would wait out its deadline in turn: the
        worker then stops as at a second signal, its leases left to expire)."""
        if self.worker._aborting.is_set() or self.silent_at_shutdown:
            call.close()
            log.warning("%s at shutdown: skipped (%s)", what, "stopping at once" if self.worker._aborting.is_set()
                        else "the database did not answer the step before")
            return
        try:
            await unless_stopped(asyncio.wait_for(call, self.settings.database_timeout), self.worker._aborting)
        except (DatabaseUnavailable, TimeoutError) as error:
            self.silent_at_shutdown = True
            log.warning("%s at shutdown: %s", what, str(error) or "no answer in time")
        except Exception:
            log.exception("%s at shutdown failed", what)

    async def _drain_completer(self) -> None:
        """Flush outcomes until none are left, within the lease (or a second after a second
        signal): unrecorded attempts keep their lease until then, then expire."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(self.settings.lease_seconds, 5.0)
        while self.completer.pending_count:
            limit = ABORT_STEP_SECONDS if self.worker._aborting.is_set() else deadline - loop.time()
            if limit <= 0:
                break
            try:
                await asyncio.wait_for(self.completer.flush_once(), limit)
            except (DatabaseUnavailable, TimeoutError) as error:
                log.warning("recording outcomes at shutdown: %s", str(error) or "no answer in time")
                if self.worker._aborting.is_set():
                    break
                await asyncio.sleep(0.5)
        if self.completer.pending_count:
            self.silent_at_shutdown = True
            log.error("%d outcome(s) could not be recorded; their leases will expire and the jobs "
                      "will be rescued", self.completer.pending_count)


def shutdown_bound(settings: Settings) -> float:
    """The longest a worker's graceful shutdown takes (its steps' deadlines added up): the
    grace period, the stop of what still runs, the outcomes' drain, three database steps."""
    return settings.shutdown_timeout + 5.0 + max(settings.lease_seconds, 5.0) + 3 * settings.database_timeout


class _Stopping(Exception):
    """The worker stopped while a claim was in flight."""
