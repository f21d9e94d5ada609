"""Progress reports as stored and published: checked, capped and shaped here, with no I/O.

A job's report is ``{"done", "total", "message", "at"}``; a pipeline run's is
``{"read", "written", "rejected", "at"}``. Both are stored on the attempt's row and
sent with ``NOTIFY``, whose payload PostgreSQL caps at 8,000 bytes: hence the cap on
the message.
"""

from __future__ import annotations

import json
import math
from datetime import datetime
from typing import Any

MAX_MESSAGE_CHARS = 500  # longer messages are cut (a progress report never fails a job)
REPORT_INTERVAL_SECONDS = 0.5  # at most one write (and one NOTIFY) per running attempt in this time


def _count(name: str, value: object) -> float | int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"progress {name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"progress {name} must be a finite number >= 0, got {value!r}")
    return value


def job_progress(done: float, total: float | None, message: str | None, at: datetime) -> dict[str, Any]:
    """A job's report: ``done`` of ``total`` (any unit: items, bytes, percent), and a message.
    Raises TypeError or ValueError for a count that is not a finite number >= 0."""
    document: dict[str, Any] = {"done": _count("done", done), "total": None, "message": None, "at": at.isoformat()}
    if total is not None:
        document["total"] = _count("total", total)
    if message is not None:
        if not isinstance(message, str):
            raise TypeError(f"progress message must be a string, got {type(message).__name__}")
        text = message.replace("\x00", "")
        document["message"] = text if len(text) <= MAX_MESSAGE_CHARS else text[: MAX_MESSAGE_CHARS - 1] + "…"
    return document


def pipeline_progress(read: int, written: int, rejected: int, at: datetime) -> dict[str, Any]:
    """A pipeline run's report: records read, written and rejected so far."""
    return {"read": read, "written": written, "rejected": rejected, "at": at.isoformat()}


def as_json(document: dict[str, Any]) -> str:
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)
