"""``/events``: job and pipeline events as Server-Sent Events, from any worker process."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from litestar import Request, get
from litestar.datastructures import State
from litestar.params import FromQuery
from litestar.response import Stream

from agora_pg.api import params
from agora_pg.errors import InvalidArgument
from agora_pg.events.model import EventFilter, InvalidCursor, parse_cursor, sse_frames
from agora_pg.events.stream import EventStream, Subscription

KEEPALIVE_SECONDS = 15.0  # a ping (with the latest cursor as its id) at least this often
RECONNECT_MILLISECONDS = 2000  # the browser's wait before it reconnects


@get("/events", tags=["events"])
async def stream_events(
    request: Request[Any, Any, State],
    job_id: FromQuery[str | None] = None,
    kind: FromQuery[str | None] = None,
    queue: FromQuery[str | None] = None,
    pipeline_id: FromQuery[str | None] = None,
    since: FromQuery[str | None] = None,
) -> Stream:
    """Job events as they happen (a pipeline's runs are jobs: ``pipeline_id`` selects
    them): ``job.enqueued``, ``job.started``, ``job.progress``, ``job.finished``,
    ``job.cancelled``, each with its JSON in ``data``. Filters combine.
    State changes carry an ``id``: a client that reconnects with ``Last-Event-ID`` (or
    ``since``) gets the changes it missed first, from the tables (a few may repeat);
    progress is live only. A ``ping`` event comes at least every 15 s."""
    filters = EventFilter(job_id=params.job_id_filter(job_id), kind=params.text_filter("kind", kind),
                          queue=params.text_filter("queue", queue),
                          pipeline_id=params.text_filter("pipeline_id", pipeline_id))
    last_event_id = request.headers.get("last-event-id")
    field, cursor = ("Last-Event-ID", last_event_id) if last_event_id else ("since", since)
    start = None
    if cursor:
        try:
            start = parse_cursor(cursor, datetime.now(UTC))
        except InvalidCursor as error:
            raise InvalidArgument(field, str(error)) from None
    stream: EventStream = request.app.state.events
    # (each stream holds a connection for as long as it lasts: past the cap, 503, so that
    # streams alone can never take every slot of AGORA_PG_API_MAX_CONNECTIONS)
    subscription = await stream.subscribe(filters, start, limit=request.app.state.max_event_streams)
    return Stream(
        _frames(subscription),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _frames(subscription: Subscription) -> AsyncIterator[bytes]:
    yield f"retry: {RECONNECT_MILLISECONDS}\n\n".encode()
    sent_at = time.monotonic()
    async for batch in subscription.batches(keepalive_seconds=KEEPALIVE_SECONDS):
        if batch.items:
            yield sse_frames(batch.items, batch.first_cursor or "", batch.last_cursor or "")
            sent_at = time.monotonic()
        elif time.monotonic() - sent_at >= KEEPALIVE_SECONDS:
            head = f"id: {batch.last_cursor}\n" if batch.last_cursor else ""
            yield f"{head}event: ping\ndata: {{}}\n\n".encode()
            sent_at = time.monotonic()
