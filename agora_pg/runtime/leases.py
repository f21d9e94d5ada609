"""The lease supervisor: one per process, for job attempts and pipeline runs alike.

Every claim hands back a lease token. The supervisor renews exactly the tokens
its process holds, in one statement every ``lease_seconds / 4``, from a thread of
its own with a database connection of its own, so an event loop blocked by a
handler cannot stop renewals. Renewal results come back to the event loop as
stop requests:

- a lease another worker took over (rescued, or a run taken over): ``LEASE_LOST``;
- a lease that could not be renewed for ``0.75 * lease_seconds`` by this process's
  monotonic clock: ``LEASE_UNRENEWED``, before the lease can expire on the server
  (self-fencing: across a database outage, at most one attempt runs);
- a job whose cancel was asked for: ``CANCEL_REQUESTED``.

The thread also watches the event loop: a loop that does not run a callback for
``blocked_loop_seconds`` is reported in a WARNING naming the attempt that blocks it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.outcomes import StopReason

log = logging.getLogger("agora_pg.leases")

RENEWALS_PER_LEASE = 4  # renew every lease_seconds / 4
FENCE_FRACTION = 0.75  # stop an attempt whose lease went unrenewed this long (of lease_seconds)
BLOCKED_LOOP_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class LeaseToken:
    """What a claim returned: a job attempt ``("job", job_id, attempt)`` or a
    pipeline run ``("run", pipeline_id, run_id)``."""

    resource: str
    key: int | str
    number: int

    @classmethod
    def job(cls, job_id: int, attempt: int) -> LeaseToken:
        return cls("job", job_id, attempt)

    @classmethod
    def run(cls, pipeline_id: str, run_id: int) -> LeaseToken:
        return cls("run", pipeline_id, run_id)


StopCallback = Callable[[StopReason], None]


@dataclasses.dataclass
class _Held:
    token: LeaseToken
    on_stop: StopCallback
    fence_at: float  # monotonic time by which a renewal must have succeeded
    task: asyncio.Task[object] | None
    description: str
    stopped: set[StopReason] = dataclasses.field(default_factory=set)


class LeaseSupervisor:
    """Renews the leases of one process; see the module docstring.

    ``hold()`` and ``release()`` are called from the event loop that ``start()``
    ran on; ``on_stop`` callbacks run on that loop too.
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
        self._held: dict[LeaseToken, _Held] = {}
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._loop_seen = time.monotonic()
        self._blocked_warned = False
        self.renewals = 0  # successful renewals (for tests and health)

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

    def hold(
        self,
        token: LeaseToken,
        on_stop: StopCallback,
        claimed_at: float,
        *,
        task: asyncio.Task[object] | None = None,
        description: str = "",
    ) -> None:
        """Renew ``token`` from now on. ``claimed_at`` is ``time.monotonic()`` taken
        before the claim was sent (the lease runs from no earlier than that)."""
        held = _Held(token, on_stop, claimed_at + self.fence_after, task, description or str(token))
        with self._lock:
            self._held[token] = held

    def attach(self, token: LeaseToken, task: asyncio.Task[object], description: str) -> None:
        """Name the task running ``token`` (for the blocked-loop warning)."""
        with self._lock:
            held = self._held.get(token)
            if held is not None:
                held.task, held.description = task, description

    def release(self, token: LeaseToken) -> None:
        """Stop renewing ``token`` (its outcome is recorded, or it was given back)."""
        with self._lock:
            self._held.pop(token, None)

    def holds(self, token: LeaseToken) -> bool:
        with self._lock:
            return token in self._held

    def held_tokens(self) -> list[LeaseToken]:
        with self._lock:
            return list(self._held)

    def _deliver(self, token: LeaseToken, reason: StopReason) -> None:
        """On the event loop: tell the holder of ``token`` to stop, once per reason."""
        with self._lock:
            held = self._held.get(token)
            if held is None or reason in held.stopped:
                return
            held.stopped.add(reason)
        held.on_stop(reason)

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
            due = [held.token for held in self._held.values()
                   if now >= held.fence_at and StopReason.LEASE_UNRENEWED not in held.stopped]
        for token in due:
            log.error("%s: lease not renewed for %.1fs; stopping it before the lease expires",
                      self._describe(token), self.fence_after)
            self._post(self._deliver, token, StopReason.LEASE_UNRENEWED)
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

    def _describe(self, token: LeaseToken) -> str:
        with self._lock:
            held = self._held.get(token)
        return held.description if held is not None else str(token)

    def _blocking_task(self) -> str:
        loop = self._loop
        task = asyncio.current_task(loop) if loop is not None else None
        if task is None:
            return "code outside any task"
        with self._lock:
            for held in self._held.values():
                if held.task is task:
                    return held.description
        return f"task {task.get_name()!r}"

    async def _renew_loop(self, store: Store) -> None:
        while not self._stopping.is_set():
            started = time.monotonic()
            with self._lock:
                tokens = list(self._held)
            try:
                await self._renew(store, tokens, started)
            except DatabaseUnavailable as error:
                log.warning("renewing %d lease(s) failed: %s", len(tokens), error)
            except Exception:  # a bug must not end renewals: it shows, and renewals go on
                log.exception("renewing %d lease(s) failed", len(tokens))
            elapsed = time.monotonic() - started
            await asyncio.sleep(max(self.renew_interval - elapsed, 0.01))

    async def _renew(self, store: Store, tokens: list[LeaseToken], sent_at: float) -> None:
        jobs = [(int(t.key), t.number) for t in tokens if t.resource == "job"]
        runs = [(str(t.key), t.number) for t in tokens if t.resource == "run"]
        renewal = await store.renew_leases(self.worker_id, self.lease_seconds, jobs, runs)
        self.renewals += 1
        lost = {t for t in tokens if (t.key in renewal.lost_jobs if t.resource == "job" else t.key in renewal.lost_runs)}
        with self._lock:
            for token in tokens:
                held = self._held.get(token)
                if held is not None and token not in lost:
                    held.fence_at = max(held.fence_at, sent_at + self.fence_after)
        for token in lost:
            if self.holds(token):
                log.warning("%s: lease lost (another worker holds it now); stopping it", self._describe(token))
                self._post(self._deliver, token, StopReason.LEASE_LOST)
        for job_id in renewal.cancel_jobs:
            for token in tokens:
                if token.resource == "job" and token.key == job_id:
                    self._post(self._deliver, token, StopReason.CANCEL_REQUESTED)
