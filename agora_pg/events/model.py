"""Events as values: their kinds, filters, cursors, and how rows and notifications
become events. No I/O.

A cursor is a time in microseconds since the epoch (written as digits, the SSE event
id): every change stamped before it was committed when the stream read past it, so a
reader that starts again from it misses nothing (it may see again a few events it had).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from agora_pg.errors import AgoraError

EVENT_TYPES = (
    "job.enqueued", "job.started", "job.progress", "job.finished", "job.cancelled",
)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MAX_CURSOR_DIGITS = 17  # microseconds up to the year 5138
MAX_REPLAY = timedelta(days=7)  # how far back a cursor may point


class InvalidCursor(AgoraError):
    """A cursor (``Last-Event-ID``, ``since``) that is not one this stream gave, or too old."""


def cursor_of(moment: datetime) -> str:
    """The cursor text of a time (microseconds since the epoch)."""
    delta = moment - EPOCH
    return str((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


def parse_cursor(text: str, now: datetime) -> datetime:
    """The time of a cursor; raises ``InvalidCursor`` for anything else, or for a time
    more than ``MAX_REPLAY`` back (read ``GET /jobs`` and ``GET /runs`` instead)."""
    text = text.strip()
    if not text.isascii() or not text.isdigit() or len(text) > MAX_CURSOR_DIGITS:
        raise InvalidCursor(f"not an event id of this stream: {text[:40]!r} (expected digits)")
    moment = EPOCH + timedelta(microseconds=int(text))
    if moment < now - MAX_REPLAY:
        raise InvalidCursor(
            f"event id {text} is more than {MAX_REPLAY.days} days old: read GET /jobs and GET /runs instead"
        )
    return min(moment, now)


@dataclasses.dataclass(frozen=True, slots=True)
class Event:
    """One event: ``type`` (one of ``EVENT_TYPES``) and its ``data`` (JSON-ready).
    ``key`` tells repeats of a state change apart (None for progress, which is never
    replayed); ``at`` is when the change was stamped."""

    type: str
    data: dict[str, Any]
    key: tuple[Any, ...] | None = None
    at: datetime | None = None

    @property
    def job_id(self) -> int | None:
        return self.data.get("job_id")

    def json(self) -> str:
        return json.dumps({"type": self.type, **self.data}, separators=(",", ":"), ensure_ascii=False)


@dataclasses.dataclass(frozen=True, slots=True)
class EventFilter:
    """Which events a reader wants: all of them, or those of one job, kind, queue or
    pipeline (given together, all must match)."""

    job_id: int | None = None
    kind: str | None = None
    queue: str | None = None
    pipeline_id: str | None = None

    def matches(self, event: Event) -> bool:
        data = event.data
        if self.pipeline_id is not None and data.get("pipeline_id") != self.pipeline_id:
            return False
        if self.job_id is not None and data.get("job_id") != self.job_id:
            return False
        if self.kind is not None and data.get("kind") != self.kind:
            return False
        return self.queue is None or data.get("queue") == self.queue

    def params(self) -> tuple[int | None, str | None, str | None, str | None]:
        """The filters as the event queries take them ($2 to $5)."""
        return self.job_id, self.kind, self.queue, self.pipeline_id


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _progress(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def event_of_row(source: str, row: Mapping[str, Any]) -> Event:
    """The event a row of an event source (``queries.EVENT_SOURCES[source]``) stands for."""
    at = row["t"]
    if source == "finished":
        return Event("job.finished", {
            "job_id": row["job_id"], "kind": row["kind"], "queue": row["queue"], "attempt": row["attempt"],
            "run_id": row["run_id"], "outcome": row["outcome"], "status": row["job_status"],
            "retry_at": _iso(row["retry_at"]), "error": row["error"], "worker_id": row["worker_id"],
            "progress": _progress(row["progress"]), "at": _iso(at),
        }, ("finished", row["run_id"]), at)
    data = {"job_id": row["job_id"], "kind": row["kind"], "queue": row["queue"], "status": row["job_status"],
            "attempt": row["attempt"], "at": _iso(at)}
    if source == "job.enqueued":
        data["run_at"] = _iso(row["retry_at"])
        return Event(source, data, (source, row["job_id"]), at)
    if source == "job.started":
        data["worker_id"] = row["worker_id"]
        data["progress"] = _progress(row["progress"])
        return Event(source, data, (source, row["job_id"], row["attempt"]), at)
    if source == "job.cancelled":
        data["error"] = row["error"]
        return Event(source, data, (source, row["job_id"]), at)
    raise ValueError(f"unknown event source {source!r}")


def event_of_notification(payload: str) -> Event | None:
    """A progress event published with NOTIFY; None for a plain "tables changed" wake-up
    or a payload that is not one (never an error: the stream goes on)."""
    if not payload:
        return None
    try:
        document = json.loads(payload)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("type") != "job.progress":
        return None
    kind = document.pop("type")
    return Event(kind, document)


def sse_body(event: Event) -> bytes:
    """The event in the Server-Sent Events format, without its id (made once per event,
    whatever the number of readers)."""
    return f"event: {event.type}\ndata: {event.json()}\n\n".encode()


def sse_frames(events: Iterable[tuple[Event, bytes]], first_cursor: str, last_cursor: str) -> bytes:
    """A read's events (with their ``sse_body``) for one reader: state changes carry
    ``first_cursor`` (where a reader that lost the rest of this read starts again), the
    last one ``last_cursor``; progress carries no id (it is not replayed)."""
    events = list(events)
    last_state = max((i for i, (event, _body) in enumerate(events) if event.key is not None), default=-1)
    parts = []
    for index, (event, body) in enumerate(events):
        if event.key is not None:
            parts.append(f"id: {last_cursor if index == last_state else first_cursor}\n".encode())
        parts.append(body)
    return b"".join(parts)
