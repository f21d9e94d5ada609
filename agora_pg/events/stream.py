"""The event stream of one process: one LISTEN connection and one reader for every
subscriber.

PostgreSQL notifies the stream when tables change (an enqueue, a batch of outcomes)
and publishes progress reports. On each wake-up, at most every
``min_interval`` seconds and at least every ``poll_seconds`` while anyone listens, the
reader reads the rows stamped since its cursor (``queries.EVENT_SOURCES``), drops the
ones it already sent, and hands the rest, then the progress reports notified before
the read, to every subscriber whose filter matches.

The cursor only moves to a time before which every change is committed
(``Store.event_times``), so a reader never skips a row whose transaction committed
late; a subscriber that comes back with its last cursor gets the state changes it
missed from the tables (``Subscription`` replays them first).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections.abc import AsyncIterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agora_pg.db import queries
from agora_pg.errors import DatabaseUnavailable, TooManyStreams
from agora_pg.events.model import EPOCH, Event, EventFilter, cursor_of, event_of_notification, event_of_row, sse_body
from agora_pg.lifecycle import wait_for_event
from agora_pg.runtime.database_calls import listen_until

if TYPE_CHECKING:
    from agora_pg.db.store import Store

log = logging.getLogger("agora_pg.events")

SOURCES = tuple(queries.EVENT_SOURCES)
START_TIMEOUT_SECONDS = 10.0
NOTIFY_JOBS_CHANNEL = "agora_jobs"  # (db.store.NOTIFY_CHANNEL: enqueues and retries due now)


@dataclasses.dataclass(frozen=True, slots=True)
class Batch:
    """Events of one read (with their SSE bodies) and the cursors that go with them:
    ``first_cursor`` where a reader that lost part of this batch starts again,
    ``last_cursor`` where one that got all of it does. Progress batches have none."""

    items: list[tuple[Event, bytes]]
    first_cursor: str | None
    last_cursor: str | None


def _batch(events: list[Event], first: datetime, last: datetime) -> Batch:
    return Batch([(event, sse_body(event)) for event in events], cursor_of(first), cursor_of(last))


class EventStream:
    """Events from the database for any number of subscribers in this process."""

    def __init__(
        self, store: Store, *, poll_seconds: float = 0.25, min_interval: float = 0.05,
        max_lag_seconds: float = 10.0, page_size: int = 2000, max_pending_events: int = 20_000,
        start_timeout: float = START_TIMEOUT_SECONDS,
    ) -> None:
        self.store = store
        self.start_timeout = start_timeout
        self.poll_seconds = poll_seconds
        self.min_interval = min_interval
        self.max_lag_seconds = max_lag_seconds  # a transaction open longer than this can be missed
        self.page_size = page_size
        self.max_pending_events = max_pending_events
        self._subscriptions: set[Subscription] = set()
        self._joining = 0  # subscribers waiting for the reader's first cursor
        self._wake = asyncio.Event()
        self._stop = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._cursor: datetime | None = None  # the reader's: every change before it was sent
        self._sent: dict[tuple[Any, ...], datetime] = {}  # keys of events at or after the cursor
        self._progress: list[Event] = []  # progress notified since the last read, sent after it
        self._started = asyncio.Event()
        self.reads = 0

    # -- subscribers -------------------------------------------------------------------

    async def subscribe(self, filters: EventFilter = EventFilter(), since: datetime | None = None,
                        limit: int | None = None) -> Subscription:
        """A new subscriber; with ``since``, state changes from then on are replayed first.
        ``TooManyStreams`` when ``limit`` subscribers are there (or joining) already."""
        if self._stop.is_set():
            raise RuntimeError("the event stream is closed")
        if limit is not None and len(self._subscriptions) + self._joining >= limit:
            raise TooManyStreams(limit)
        self._joining += 1
        try:
            return await self._join(filters, since)
        finally:
            self._joining -= 1

    async def _join(self, filters: EventFilter, since: datetime | None) -> Subscription:
        if not self._tasks:
            self._tasks = [
                asyncio.create_task(self._read_loop(), name="event-stream-reader"),
                asyncio.create_task(self._listen(), name="event-stream-listener"),
            ]
        try:  # (the first subscriber waits for the reader's first cursor)
            await asyncio.wait_for(asyncio.shield(self._started.wait()), self.start_timeout)
        except TimeoutError:
            raise DatabaseUnavailable("the event stream cannot read the database yet") from None
        subscription = Subscription(self, filters, since)
        self._subscriptions.add(subscription)
        self._wake.set()
        return subscription

    def _unsubscribe(self, subscription: Subscription) -> None:
        self._subscriptions.discard(subscription)

    @property
    def subscribers(self) -> int:
        return len(self._subscriptions)

    def _broadcast(self, batch: Batch) -> None:
        for subscription in list(self._subscriptions):
            subscription._put(batch)

    async def close(self) -> None:
        """Stop reading and end every subscription."""
        self._stop.set()
        self._wake.set()
        for subscription in list(self._subscriptions):
            subscription._end()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    # -- reading -----------------------------------------------------------------------

    async def read_since(self, since: datetime, filters: EventFilter) -> AsyncIterator[list[Event]]:
        """Every state change stamped at or after ``since`` that matches, in time order,
        a page at a time (pages of several sources are merged up to the earliest time
        where one of them was cut)."""
        start, page = since, self.page_size
        while True:
            pages = {
                source: await self.store.read_events(source, start, filters.params(), None, page)
                for source in SOURCES
            }
            cut = [rows[-1]["t"] for rows in pages.values() if len(rows) == page]
            bound = min(cut) if cut else None
            if bound is not None and bound <= start:
                page *= 2  # more rows share one instant than a page holds
                continue
            events = [
                event_of_row(source, row) for source, rows in pages.items() for row in rows
                if bound is None or row["t"] < bound
            ]
            events.sort(key=lambda event: event.at or EPOCH)  # (stable: sources keep their order at one instant)
            yield events
            if bound is None:
                return
            start, page = bound, self.page_size

    async def _read_loop(self) -> None:
        while not self._stop.is_set():
            try:
                _now, self._cursor = await self.store.event_times(self.max_lag_seconds)
                break
            except DatabaseUnavailable as error:
                log.warning("event stream: %s; retrying in 1s", error)
                await wait_for_event(self._stop, 1.0)
        self._started.set()
        while not self._stop.is_set():
            await wait_for_event(self._wake, self.poll_seconds)
            self._wake.clear()
            if not self._subscriptions:
                continue
            try:
                await self._read_once()
            except DatabaseUnavailable as error:
                log.warning("event stream: %s; reading again in 1s", error)
                await wait_for_event(self._stop, 1.0)
            except Exception:
                log.exception("event stream: reading events failed; reading again in 1s")
                await wait_for_event(self._stop, 1.0)
            await asyncio.sleep(self.min_interval)

    async def _read_once(self) -> None:
        assert self._cursor is not None
        start = self._cursor
        progress, self._progress = self._progress, []
        _now, safe = await self.store.event_times(self.max_lag_seconds)
        self.reads += 1
        sent = 0
        held: list[Event] = []  # the newest page, sent last with the read's new cursor
        async for events in self.read_since(start, EventFilter()):
            fresh = []
            for event in events:
                if event.key not in self._sent:
                    assert event.at is not None and event.key is not None
                    self._sent[event.key] = event.at
                    fresh.append(event)
            if fresh:  # a page at a time: subscribers take each while the next is read
                if held:
                    self._broadcast(_batch(held, start, start))
                held = fresh
                sent += len(fresh)
        safe = max(safe, start)
        log.debug("event stream read from %s: %d fresh, cursor now %s", start, sent, safe)
        self._broadcast(_batch(held + progress, start, safe))
        self._cursor = safe
        self._sent = {key: at for key, at in self._sent.items() if at >= safe}

    async def _listen(self) -> None:
        channels = {queries.EVENTS_CHANNEL: self._on_event, NOTIFY_JOBS_CHANNEL: self._on_change}
        await listen_until(self.store, channels, self._stop, self._wake.set, "LISTEN for events")

    def _on_change(self, _payload: str) -> None:
        self._wake.set()

    def _on_event(self, payload: str) -> None:
        event = event_of_notification(payload)
        if event is not None and self._subscriptions:
            # Sent after the next read, so that it follows the job.started it belongs to.
            self._progress.append(event)
        self._wake.set()


class Subscription:
    """One subscriber's events: ``batches()`` (replay, then live), ``events()`` for Python
    callers. Ends when the stream closes, or when the subscriber falls more than
    ``max_pending_events`` behind (it may subscribe again from its last cursor)."""

    def __init__(self, stream: EventStream, filters: EventFilter, since: datetime | None) -> None:
        self.stream = stream
        self.filters = filters
        self._everything = filters == EventFilter()
        self.since = since
        self.cursor: str | None = cursor_of(since) if since is not None else None
        self.overflowed = False
        self._queue: asyncio.Queue[Batch | None] = asyncio.Queue()
        self._pending = 0
        self._ended = False

    def _put(self, batch: Batch) -> None:
        if self._ended:
            return
        items = batch.items if self._everything else [item for item in batch.items if self.filters.matches(item[0])]
        if not items and batch.first_cursor is None:
            return
        self._pending += len(items)
        if self._pending > self.stream.max_pending_events:
            log.warning("event stream: a subscriber fell %d events behind; ending its stream", self._pending)
            self.overflowed = True
            self._end()
            return
        self._queue.put_nowait(Batch(items, batch.first_cursor, batch.last_cursor))

    def _end(self) -> None:
        if not self._ended:
            self._ended = True
            self._queue.put_nowait(None)

    def close(self) -> None:
        self.stream._unsubscribe(self)
        self._end()

    async def batches(self, keepalive_seconds: float | None = None) -> AsyncIterator[Batch]:
        """Replayed state changes (with ``since``), then live batches, with no event
        twice across the seam. With ``keepalive_seconds``, an empty batch carrying the
        latest cursor comes at least that often."""
        try:
            replayed: set[Any] | None = None
            replayed_until = ""  # cursor of the newest replayed change: live batches from past it are all new
            if self.since is not None:
                replayed = set()
                _now, replay_end = await self.stream.store.event_times(self.stream.max_lag_seconds)
                newest = first = self.since
                async for events in self.stream.read_since(self.since, self.filters):
                    replayed.update(event.key for event in events)
                    newest = max([newest, *(event.at for event in events if event.at is not None)])
                    yield _batch(events, first, first)
                replayed_until = cursor_of(newest)
                self.cursor = cursor_of(max(replay_end, first))
                yield Batch([], cursor_of(first), self.cursor)
            while True:
                try:
                    batch = await asyncio.wait_for(self._queue.get(), keepalive_seconds)
                except TimeoutError:
                    yield Batch([], self.cursor, self.cursor)
                    continue
                if batch is None:
                    return
                self._pending -= len(batch.items)
                first_cursor = batch.first_cursor
                if replayed is not None and first_cursor is not None:
                    batch = Batch([item for item in batch.items if item[0].key not in replayed],
                                  first_cursor, batch.last_cursor)
                    if int(first_cursor) > int(replayed_until):
                        replayed = None
                if batch.last_cursor is not None:
                    self.cursor = batch.last_cursor
                yield batch
        finally:
            self.close()

    async def events(self) -> AsyncIterator[Event]:
        """The events alone, in order."""
        async for batch in self.batches():
            for event, _body in batch.items:
                yield event
