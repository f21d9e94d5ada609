"""Checks on query and path values that the types alone do not make (pure)."""

from __future__ import annotations

import re
from datetime import datetime

from agora_pg.errors import InvalidArgument
from agora_pg.job_spec import time_problem
from agora_pg.jobs import possible_job_id

DEFAULT_LIMIT = 50
MAX_LIMIT = 500


def page_limit(limit: int) -> int:
    if not 1 <= limit <= MAX_LIMIT:
        raise InvalidArgument("limit", f"must be between 1 and {MAX_LIMIT}, got {limit}")
    return limit


_PLAIN_ID = re.compile(r"[1-9][0-9]{0,18}")


def plain_id(text: str) -> int | None:
    """The id ``text`` writes in plain ASCII decimal digits (no sign, no leading zero, a
    possible bigint id), or None: ``int()`` would also read ``01``, ``+1`` and ``٣``.
    Job and run ids, and the cursors made of them, are all read this way."""
    if _PLAIN_ID.fullmatch(text) is None or not possible_job_id(int(text)):
        return None
    return int(text)


def cursor_id(cursor: str | None) -> int | None:
    """The id a cursor from ``next_cursor`` stands for (rows older than it come next)."""
    return _id_param("cursor", cursor, "not a cursor this API returned")


def job_id_filter(text: str | None) -> int | None:
    """A job id given as query text: plain decimal digits of a possible id."""
    return _id_param("job_id", text, f"no job can have id {(text or '')[:40]!r} (ids are plain decimal numbers)")


def _id_param(field: str, text: str | None, problem: str) -> int | None:
    value = None if text is None else plain_id(text)
    if text is not None and value is None:
        raise InvalidArgument(field, problem)
    return value


def next_cursor(ids: list[int], limit: int) -> str | None:
    """A full page may have more after it; a short one is the last."""
    return str(ids[-1]) if len(ids) == limit else None


def text_filter(field: str, value: str | None) -> str | None:
    """A name to compare with a column: text PostgreSQL can hold."""
    if value is None:
        return None
    if not value.strip():
        raise InvalidArgument(field, "must not be empty (leave the parameter out to match any)")
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    if len(value) > 1000:
        raise InvalidArgument(field, "longer than 1000 characters")
    _encodable(field, value)
    return value


_TIMESTAMP_START = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt ]")


def timestamp(field: str, text: str | None) -> datetime | None:
    """An RFC 3339 timestamp given as text (not a number of seconds), aware and in range."""
    if text is None:
        return None
    problem = "expected an RFC 3339 timestamp with a time zone, such as 2026-01-01T00:00:00Z"
    if not _TIMESTAMP_START.match(text):
        raise InvalidArgument(field, f"{problem}, got {text[:40]!r}")
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgument(field, f"{problem}, got {text[:40]!r}") from None
    return aware(field, value)


def aware(field: str, value: datetime | None) -> datetime | None:
    """A timestamp with a time zone, within the range agora-pg accepts."""
    if value is None:
        return None
    if value.tzinfo is None or value.utcoffset() is None:
        raise InvalidArgument(field, "expected a timezone-aware timestamp (for example 2026-01-01T00:00:00Z)")
    problem = time_problem(value)
    if problem is not None:
        raise InvalidArgument(field, problem)
    return value


def _encodable(field: str, value: str) -> None:
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InvalidArgument(field, "not valid UTF-8 text") from None
