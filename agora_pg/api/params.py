"""Checks on query and path values that the types alone do not make (pure)."""

from __future__ import annotations

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


def cursor_id(cursor: str | None) -> int | None:
    """The id a cursor from ``next_cursor`` stands for (rows older than it come next)."""
    if cursor is None:
        return None
    # (job and run ids are both bigint: the same bound)
    if not cursor.isascii() or not cursor.isdigit() or not possible_job_id(int(cursor)):
        raise InvalidArgument("cursor", "not a cursor this API returned")
    return int(cursor)


def next_cursor(ids: list[int], limit: int) -> str | None:
    """A full page may have more after it; a short one is the last."""
    return str(ids[-1]) if len(ids) == limit else None


def text_filter(field: str, value: str | None) -> str | None:
    """A name to compare with a column: text PostgreSQL can hold."""
    if value is None:
        return None
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain NUL characters")
    if len(value) > 1000:
        raise InvalidArgument(field, "longer than 1000 characters")
    _encodable(field, value)
    return value


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
