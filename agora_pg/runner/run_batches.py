"""Pipeline-run statements of all the pipelines of a process, many per statement.

Each pipeline's loop asks for its own run when it wakes (``await batches.claim(...)``)
and records the run's end when it is over (``await batches.finish(...)``); the asks of
one kind that arrive while a statement of that kind is in flight go out together in the
next one. A thousand pipelines due at the same minute thus cost a handful of claim
statements and a handful of finish statements, not a thousand of each (queueing for a
pool of five connections, the finishes of the first runs would delay the claims of the
next ones).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import Generic, TypeVar

from agora_pg.db.schedule_rows import ClaimedRun, RunFinish, ScheduleRow
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.lifecycle import resolve_once
from agora_pg.runner.database_clock import DatabaseClock
from agora_pg.runner.tick_shares import TickShares

log = logging.getLogger("agora_pg.runner")

MAX_BATCH = 1000  # asks per statement
# A claim statement goes out at least this long after its first ask: pipelines due at the
# same moment may wake a few ms apart (a newer reading of the database clock moved some
# wake-ups), and one statement for all is faster than one per wave.
CLAIM_GATHER_SECONDS = 0.005
# How often a process reads which processes it shares the ticks with (a process that
# starts is one of them from its registration on; one that stops cleanly, no longer).
PEERS_REFRESH_SECONDS = 2.0
READY_TIMEOUT = 60.0  # a process becomes a peer once its pipelines have made a claim, or after this

Ask = TypeVar("Ask")
Answer = TypeVar("Answer")


@dataclasses.dataclass(eq=False)  # (found by identity)
class _Pending(Generic[Ask, Answer]):
    key: str
    ask: Ask
    answer: asyncio.Future[Answer | None]
    not_before: float  # time.monotonic() before which the ask is not sent


class _Batcher(Generic[Ask, Answer]):
    """Sends asks through ``send`` (asks in, answers by key out), one statement in flight
    at a time, the first ``gather_seconds`` after its first ask, none before its asks'
    ``not_before``; an ask whose key is not in the answers gets None."""

    def __init__(
        self, send: Callable[[list[Ask]], Awaitable[Mapping[str, Answer]]], name: str,
        gather_seconds: float = 0.0,
    ) -> None:
        self._send_batch = send
        self._gather_seconds = gather_seconds
        self._name = name
        self._pending: list[_Pending[Ask, Answer]] = []
        self._sender: asyncio.Task[None] | None = None
        self._first_ask_at = 0.0
        self._nap: asyncio.Future[None] | None = None  # the sender waiting for a not_before
        self._nap_until = 0.0  # (monotonic) the moment it waits for

    async def ask(self, key: str, ask: Ask, not_before: float = 0.0) -> Answer | None:
        """The answer for ``key``, asked in a statement sent at ``not_before`` (monotonic)
        or later. Raises what the statement raised. Cancelling the caller withdraws an
        ask not sent yet; one already sent may have committed (as a lost reply would)."""
        pending: _Pending[Ask, Answer] = _Pending(key, ask, asyncio.get_running_loop().create_future(), not_before)
        self._pending.append(pending)
        if self._sender is None:
            self._first_ask_at = time.monotonic()
            self._sender = asyncio.create_task(self._send(), name=self._name)
        elif self._nap is not None and not self._nap.done() and not_before < self._nap_until:
            # Due sooner than the moment the sender waits for (a tick's own claims asked
            # while it waits for a fallback claim's): it looks again at what is pending.
            self._nap.set_result(None)
        try:
            return await asyncio.shield(pending.answer)
        except asyncio.CancelledError:
            if pending in self._pending:  # not sent: a stopping pipeline leaves no claim behind
                self._pending.remove(pending)
            raise

    async def _send(self) -> None:
        try:
            gathered = time.monotonic() - self._first_ask_at  # (a wave of wake-ups may have taken longer)
            if gathered < self._gather_seconds:
                await asyncio.sleep(self._gather_seconds - gathered)
            while self._pending:
                wait = min(pending.not_before for pending in self._pending) - time.monotonic()
                if wait > 0:
                    await self._wait_for_due(wait)
                    continue
                batch = self._next_batch()
                try:
                    await self._send_one(batch)
                except BaseException:
                    for pending in batch + self._pending:
                        pending.answer.cancel()
                    self._pending = []
                    raise
        finally:
            self._sender = None

    async def _wait_for_due(self, seconds: float) -> None:
        """Wait ``seconds``, or less if an ask due sooner than that arrives."""
        loop = asyncio.get_running_loop()
        self._nap = nap = loop.create_future()
        self._nap_until = time.monotonic() + seconds
        timer = loop.call_later(seconds, resolve_once, nap, None)
        try:
            await nap
        finally:
            timer.cancel()
            self._nap = None

    async def _send_one(self, batch: list[_Pending[Ask, Answer]]) -> None:
        try:
            answers = await self._send_batch([pending.ask for pending in batch])
        except Exception as error:  # each caller decides (a DatabaseUnavailable is retried)
            for pending in batch:
                if not pending.answer.done():
                    pending.answer.set_exception(error)
                    pending.answer.exception()  # (retrieved: a caller that gave up raises no warning)
            return
        for pending in batch:
            if not pending.answer.done():
                pending.answer.set_result(answers.get(pending.key))

    def _next_batch(self) -> list[_Pending[Ask, Answer]]:
        """The asks to send now: due ones, one per key (a second ask of the same key waits
        for the next statement), at most ``MAX_BATCH``."""
        batch: list[_Pending[Ask, Answer]] = []
        later: list[_Pending[Ask, Answer]] = []
        keys: set[str] = set()
        now = time.monotonic()
        for pending in self._pending:
            if pending.key in keys or len(batch) >= MAX_BATCH or pending.not_before > now:
                later.append(pending)
            else:
                keys.add(pending.key)
                batch.append(pending)
        self._pending = later
        return batch


class RunBatches:
    """The run claims, run finishes and schedule reads of one worker id on one Store, the
    database clock its claims read, and its share of the ticks (``tick_shares``)."""

    def __init__(self, store: Store, worker_id: str, lease_seconds: float) -> None:
        self.clock = DatabaseClock()
        self.shares = TickShares(worker_id)
        self._expected_pipelines: int | None = None  # (known once share_ticks starts)
        self._ready_pipelines: set[str] = set()
        self._all_ready = asyncio.Event()
        self._store = store
        self._worker_id = worker_id
        self._lease_seconds = lease_seconds
        self._claims: _Batcher[tuple[str, str], ClaimedRun] = _Batcher(
            self._claim_many, "pipeline-run-claims", CLAIM_GATHER_SECONDS
        )
        self._finishes: _Batcher[RunFinish, bool] = _Batcher(self._finish_many, "pipeline-run-finishes")
        self._reads: _Batcher[str, ScheduleRow] = _Batcher(
            self._store.schedules.get_many, "schedule-reads", CLAIM_GATHER_SECONDS
        )
        self._clock_read: asyncio.Task[None] | None = None

    async def read_clock(self) -> None:
        """Read the database clock unless it has been read (one statement, whoever asks)."""
        if self.clock.read:
            return
        if self._clock_read is None or self._clock_read.done():
            self._clock_read = asyncio.create_task(self._read_clock(), name="database-clock")
        await asyncio.shield(self._clock_read)

    async def _read_clock(self) -> None:
        self.clock.observe(*await self._store.read_database_clock())

    async def claim(self, pipeline_id: str, spec: str, not_before: float = 0.0) -> ClaimedRun | None:
        """Claim the pipeline's due run (as ``store.schedules.claim_runs``) in a statement
        sent at monotonic ``not_before`` or later, or None when it is not due, leased, or
        registered with another spec. A claim for a due moment (``not_before`` given) of a
        pipeline another process claims first is sent ``FALLBACK_DELAY`` later. A claim
        whose reply was lost is found and settled by the pipeline's next claim."""
        if not_before:
            not_before += self.shares.claim_delay(pipeline_id)
        return await self._claims.ask(pipeline_id, (pipeline_id, spec), not_before)

    async def finish(self, finish: RunFinish) -> bool:
        """Record a run's end (as ``store.schedules.finish_runs``); False when this worker
        no longer held the run's lease."""
        return bool(await self._finishes.ask(finish.pipeline_id, finish))

    async def read_schedule(self, pipeline_id: str) -> ScheduleRow | None:
        """The pipeline's schedule row (as ``store.schedules.get``), read in one statement
        with those of the other pipelines that ask meanwhile (the losers of one tick's
        claims all look at their rows at once); None when it has none."""
        return await self._reads.ask(pipeline_id, pipeline_id)

    def pipeline_ready(self, pipeline_id: str) -> None:
        """The pipeline has registered and made its first claim (see ``share_ticks``)."""
        self._ready_pipelines.add(pipeline_id)
        self._note_if_all_ready()

    def _note_if_all_ready(self) -> None:
        if self._expected_pipelines is not None and len(self._ready_pipelines) >= self._expected_pipelines:
            self._all_ready.set()

    async def share_ticks(
        self, hostname: str, pid: int, pipelines: int, interval: float = PEERS_REFRESH_SECONDS
    ) -> None:
        """Once the process's ``pipelines`` pipelines are ready (a process that is a peer
        before its pipelines claim would leave its share of a tick to the fallback), register
        it as one that runs pipelines, then read the live peers it shares the ticks with
        (and the database clock) every ``interval`` seconds, until cancelled. While the
        database is away the last peers read stand (claims still decide who runs a tick)."""
        self._expected_pipelines = pipelines
        self._note_if_all_ready()
        with contextlib.suppress(TimeoutError):  # (a pipeline stuck that long: the others are ready)
            await asyncio.wait_for(self._all_ready.wait(), READY_TIMEOUT)
        registered = False
        while True:
            try:
                if not registered:
                    await self._store.workers.register(self._worker_id, hostname, pid, (), runs_pipelines=True)
                    registered = True
                peers, database_now, sent_at = await self._store.workers.live_pipeline_workers(self._lease_seconds)
                self.shares.update(peers)
                self.clock.observe(database_now, sent_at)
            except DatabaseUnavailable as error:
                log.debug("reading the processes that share the ticks failed: %s", error)
            except Exception:  # never ends the pool: every process then simply claims every tick
                log.exception("reading the processes that share the ticks failed")
            await asyncio.sleep(interval)

    async def _claim_many(self, asks: list[tuple[str, str]]) -> Mapping[str, ClaimedRun]:
        claimed = await self._store.schedules.claim_runs(asks, self._worker_id, self._lease_seconds)
        for run in itertools.islice(claimed.values(), 1):  # (one statement: one reading)
            self.clock.observe(run.database_now, run.sent_at)
        return claimed

    async def _finish_many(self, finishes: list[RunFinish]) -> Mapping[str, bool]:
        recorded: Collection[str] = await self._store.schedules.finish_runs(finishes)
        return dict.fromkeys(recorded, True)
