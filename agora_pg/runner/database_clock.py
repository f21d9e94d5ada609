"""The database's clock as seen from this host: pure, no I/O.

Run times are the database's (a host clock may be off), so a pipeline wakes for its next
run by an estimate of the database clock. Each claim statement gives a reading: the
statement's start by the database (``statement_timestamp()``) paired with the host's
monotonic time when it was sent. A reading puts the database ahead by the time the
statement took to reach the server (1-4 ms measured here), never behind, so the best
reading is the one that puts it least ahead. All the pipelines of a process share one
clock, so that pipelines due at the same moment wake at the same moment and their claims
go out in one statement, not in one statement per reading.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from datetime import UTC, datetime

READING_WINDOW = 120.0  # seconds a reading counts (clocks drift; the database's may be stepped)


class DatabaseClock:
    """The database clock, estimated from the readings of the last ``window`` seconds
    (or the newest reading, when all are older)."""

    def __init__(self, window: float = READING_WINDOW, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._window = window
        self._monotonic = monotonic
        self._readings: collections.deque[tuple[float, float]] = collections.deque()  # (sent_at, offset)

    @property
    def read(self) -> bool:
        """Whether there has been a reading (``now()`` needs one)."""
        return bool(self._readings)

    def observe(self, database_now: datetime, sent_at: float) -> None:
        """A reading: the database clock was ``database_now`` at about monotonic ``sent_at``.
        Readings older than the window are dropped, but the newest is always kept."""
        self._readings.append((sent_at, database_now.timestamp() - sent_at))
        newest = max(at for at, _ in self._readings)
        while len(self._readings) > 1 and self._readings[0][0] < newest - self._window:
            self._readings.popleft()

    def now(self) -> datetime:
        """The database's time now. Needs a reading first."""
        if not self._readings:
            raise LookupError("the database clock has not been read yet")
        offset = min(offset for _, offset in self._readings)
        return datetime.fromtimestamp(self._monotonic() + offset, UTC)
