"""The lease supervisor: one per worker, for its job attempts (a scheduled pipeline's run is one).

Every claim hands back a lease token. The supervisor renews the leases of its
process in one statement every ``lease_seconds / 3``, from a thread of its own with a
database connection of its own, so an event loop blocked by a handler cannot stop
renewals. A job attempt is covered by its worker's lease (``agora.workers.lease_expires_at``:
the renewal writes that one row and reads the job rows). Renewal results come back to
the event loop as stop requests:

- a lease another worker took over (rescued): ``LEASE_LOST``;
- a lease that could not be renewed for ``0.75 * lease_seconds`` by this process's
  monotonic clock: ``LEASE_UNRENEWED``, before the lease can expire on the server
  (self-fencing: across a database outage, at most one attempt runs);
- a job whose cancel was asked for: ``CANCEL_REQUESTED``.

Jobs held in the worker's name that it does not hold here (a claim that committed but
whose reply was lost) are handed to ``on_unknown_jobs``, which runs them: under a live
worker lease nothing else would ever take them back.

The thread also watches the event loop: a loop that does not run a callback for
``blocked_loop_seconds`` is reported in a WARNING naming the attempt that blocks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterable
from typing import NamedTuple, Protocol

from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.outcomes import StopReason
from agora_pg.settings import Settings

log = logging.getLogger("agora_pg.leases")

RENEWALS_PER_LEASE = 3  # renew every lease_seconds / 3 (10 s of the default 30 s, as Procrastinate)
FENCE_FRACTION = 0.75  # stop an attempt whose lease went unrenewed this long (of lease_seconds)
BLOCKED_LOOP_SECONDS = 1.0


class LeaseToken(NamedTuple):
    """What a claim returned: a job attempt. (A tuple: it is hashed several times per
    job, and a tuple's hash is computed in C.)"""

    job_id: int
    attempt: int


class LeaseHolder(Protocol):
    """What holds a lease: a job attempt, hashed by identity. The
    supervisor keeps its bookkeeping on the holder itself (no object of its own per
    lease: a worker takes tens of thousands a second, and each object it keeps alive
    is work for the garbage collector): ``fence_at``, the ``time.monotonic()`` by which
    a renewal must have succeeded, and ``stopped_for``, the reasons it was told to stop."""

    fence_at: float
    stopped_for: tuple[StopReason, ...]

    @property
    def token(self) -> LeaseToken: ...

    @property
    def description(self) -> str: ...  # for log lines (computed only when one is written)

    @property
    def task(self) -> asyncio.Task[object] | None: ...  # to name what blocks the event loop

    def stop(self, reason: StopReason) -> None: ...


@contextlib.asynccontextmanager
async def supervising(
    supervisor: LeaseSupervisor | None, database: Database, worker_id: str, settings: Settings
) -> AsyncIterator[LeaseSupervisor]:
    """``supervisor`` when one is given (a WorkerPool's); otherwise a supervisor of the
    caller's own, started now and stopped when the block ends."""
    if supervisor is not None:
        yield supervisor
        return
    own = LeaseSupervisor(database, worker_id, settings.lease_seconds, database_timeout=settings.database_timeout)
    own.start()
    try:
        yield own
    finally:
        await own.stop()


class LeaseSupervisor:
    """Renews the leases of one process; see the module docstring.

    ``hold()`` and ``release()`` are called from the event loop that ``start()``
    ran on; holders' ``stop()`` is called on that loop too.
    """

    def __init__(
        self,
        database: Database,
        worker_id: str,
        lease_seconds: float,
        *,
        database_timeout: float = 30.0,
        blocked_loop_seconds: float = BLOCKED_LOOP_SECONDS,
    ) -> None:
        self.database = database
        self.worker_id = worker_id
        self.lease_seconds = float(lease_seconds)
        self.renew_interval = self.lease_seconds / RENEWALS_PER_LEASE
        self.fence_after = self.lease_seconds * FENCE_FRACTION
        # A renewal that takes longer than its interval is given up and tried afresh.
        self._renew_timeout = min(database_timeout, self.renew_interval)
        self.blocked_loop_seconds = blocked_loop_seconds
        self._held: set[LeaseHolder] = set()  # by identity: no token object is built per lease
        self._covered: set[LeaseHolder] = set()  # the held jobs under the worker's lease
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop_seen = time.monotonic()
        self._blocked_warned = False
        # The worker lease in the database runs from no earlier than this time.monotonic():
        # the send time of the last renewal that renewed it (before any did: of the first
        # renewal sent, as none before it can have set the lease).
        self._worker_lease_from: float | None = None
        self.on_unknown_jobs: Callable[[frozenset[int]], None] | None = None

    # -- the event loop's side -------------------------------------------------

    def start(self) -> None:
        """Start the renewal thread (call from the event loop the leases belong to)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._loop_seen = time.monotonic()
        self._thread = threading.Thread(target=self._thread_main, name=f"agora-leases-{self.worker_id}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """Stop renewing (leases still held will expire) and end the thread."""
        self._stopping.set()
        thread = self._thread
        deadline = time.monotonic() + 10
        while thread is not None and thread.is_alive() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    def hold(self, holders: Iterable[LeaseHolder], claimed_at: float, *, worker_lease: bool = False) -> None:
        """Renew the holders' leases from now on. ``claimed_at`` is ``time.monotonic()``
        taken before the claim was sent (a lease of the holder's own runs from no earlier
        than that); ``worker_lease``: the holders are jobs covered by the worker's lease,
        which may have been renewed last before the claim."""
        since = claimed_at
        if worker_lease and self._worker_lease_from is not None:
            since = min(claimed_at, self._worker_lease_from)
        fence_at = since + self.fence_after
        with self._lock:
            for holder in holders:
                holder.fence_at = fence_at
                self._held.add(holder)
                if worker_lease:
                    self._covered.add(holder)

    def release(self, holders: Iterable[LeaseHolder]) -> None:
        """Stop renewing these leases (their outcomes are recorded, or they were given back)."""
        with self._lock:
            self._held.difference_update(holders)
            self._covered.difference_update(holders)

    def held_tokens(self) -> list[LeaseToken]:
        with self._lock:
            holders = list(self._held)
        return [holder.token for holder in holders]

    def _deliver(self, holder: LeaseHolder, reason: StopReason) -> None:
        """On the event loop: tell ``holder`` to stop, once per reason, while it holds its lease."""
        with self._lock:
            if holder not in self._held or reason in holder.stopped_for:
                return
            holder.stopped_for += (reason,)
        holder.stop(reason)

    def _loop_alive(self) -> None:
        self._loop_seen = time.monotonic()

    # -- the thread's side -------------------------------------------------------

    def _thread_main(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        store = Store.open(self.database, pool_size=1, timeout=self._renew_timeout)
        renewer = asyncio.create_task(self._renew_loop(store))
        try:
            while not self._stopping.is_set():
                self._watch()
                await asyncio.sleep(min(0.1, self.renew_interval / 2))
        finally:
            renewer.cancel()
            await asyncio.gather(renewer, return_exceptions=True)
            await store.close()

    def _post(self, callback: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(callback, *args)
        except RuntimeError:  # the loop closed meanwhile
            pass

    def _watch(self) -> None:
        """Fence leases that went unrenewed too long; check that the event loop runs."""
        now = time.monotonic()
        with self._lock:
            due = [holder for holder in self._held
                   if now >= holder.fence_at and StopReason.LEASE_UNRENEWED not in holder.stopped_for]
        for holder in due:
            unrenewed = now - holder.fence_at + self.fence_after  # (more than fence_after after a freeze)
            log.error("%s: lease not renewed for %.1fs; %s", holder.description, unrenewed, "stopping it before the "
                      "lease expires" if unrenewed < self.lease_seconds else "the lease had expired (this process was "
                      "frozen or cut off): the attempt is given up, and another worker may have rescued the job")
            self._post(self._deliver, holder, StopReason.LEASE_UNRENEWED)
        self._post(self._loop_alive)
        blocked = now - self._loop_seen
        if blocked >= self.blocked_loop_seconds and not self._blocked_warned:
            self._blocked_warned = True
            log.warning(
                "the event loop has been blocked for %.1fs by %s: an async handler must not block "
                "(time.sleep, blocking I/O, heavy CPU work); await non-blocking calls, or make the "
                "handler a plain def (sync handlers run in a thread). Leases are still renewed.",
                blocked, self._blocking_task(),
            )
        elif blocked < self.blocked_loop_seconds and self._blocked_warned:
            self._blocked_warned = False
            log.info("the event loop runs again")

    def _blocking_task(self) -> str:
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            return "code outside any task"
        with self._lock:
            holders = list(self._held)
        for holder in holders:
            if holder.task is task:
                return holder.description
        return f"task {task.get_name()!r}"

    async def _renew_loop(self, store: Store) -> None:
        failing_since: float | None = None
        while not self._stopping.is_set():
            started = time.monotonic()
            with self._lock:
                holders = list(self._held)
            try:
                await self._renew(store, holders, started)
                if failing_since is not None:
                    log.info("renewing leases works again after %.1fs", started - failing_since)
                    failing_since = None
            except DatabaseUnavailable as error:
                # the first failure of an outage is a WARNING; the following ones repeat it quietly
                level = logging.WARNING if failing_since is None else logging.DEBUG
                failing_since = failing_since or started
                log.log(level, "renewing %d lease(s) failed: %s", len(holders), error)
            except Exception:  # a bug must not end renewals: it shows, and renewals go on
                log.exception("renewing %d lease(s) failed", len(holders))
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(self.renew_interval - elapsed, 0.01))

    async def _renew(self, store: Store, holders: list[LeaseHolder], sent_at: float) -> None:
        tokens = [holder.token for holder in holders]
        jobs = [(t.job_id, t.attempt) for t in tokens]
        if self._worker_lease_from is None:
            self._worker_lease_from = sent_at
        renewal = await store.workers.renew_leases(self.worker_id, self.lease_seconds, jobs)
        if renewal.worker_renewed:
            self._worker_lease_from = sent_at
        lost = [holder for holder, t in zip(holders, tokens, strict=True)
                if t in renewal.lost_jobs]
        fence_at = sent_at + self.fence_after
        lost_now = set(lost)
        with self._lock:
            renewed: list[LeaseHolder] = []
            listed_jobs = [holder for holder in holders if holder in self._held]
            if renewal.worker_renewed:
                # The listed jobs' own leases were folded into the worker's, which covers every
                # job held under it, listed or claimed since the list was taken.
                self._covered.update(listed_jobs)
                renewed.extend(self._covered)
            else:
                # No worker row, so no worker lease: the listed jobs' own leases were renewed.
                self._covered.difference_update(listed_jobs)
                renewed.extend(listed_jobs)
            for holder in renewed:
                if holder in self._held and holder not in lost_now:
                    holder.fence_at = max(holder.fence_at, fence_at)
            lost = [holder for holder in lost if holder in self._held]
        for holder in lost:
            log.warning("%s: lease lost (another worker holds it now); stopping it", holder.description)
            self._post(self._deliver, holder, StopReason.LEASE_LOST)
        for holder, t in zip(holders, tokens, strict=True):
            if t in renewal.cancel_jobs:
                self._post(self._deliver, holder, StopReason.CANCEL_REQUESTED)
        if renewal.unknown_jobs:
            self._post(self._hand_unknown, renewal.unknown_jobs)

    def _hand_unknown(self, job_ids: frozenset[int]) -> None:
        """On the event loop: jobs held in this worker's name that it does not hold here."""
        if self.on_unknown_jobs is not None:
            self.on_unknown_jobs(job_ids)
        else:
            log.warning("jobs %s are held in the name of %s, which runs no job worker", sorted(job_ids),
                        self.worker_id)
