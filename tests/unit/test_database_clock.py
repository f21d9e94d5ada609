"""The database clock estimate and the pipelines' wake signal: pure, no database."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from agora_pg.lifecycle import WakeSignal
from agora_pg.runner.database_clock import DatabaseClock

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


class FakeMonotonic:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_clock_needs_a_reading() -> None:
    clock = DatabaseClock(monotonic=FakeMonotonic())
    assert not clock.read
    with pytest.raises(LookupError):
        clock.now()


def test_the_reading_that_puts_the_database_least_ahead_wins() -> None:
    # Each reading is the statement's start by the database paired with the moment it was
    # sent: it puts the database ahead by the statement's way to the server. Of two, the
    # smaller offset is the better one, whichever came first.
    monotonic = FakeMonotonic()
    clock = DatabaseClock(monotonic=monotonic)
    clock.observe(T0 + timedelta(milliseconds=4), sent_at=1000.0)  # 4 ms on its way
    clock.observe(T0 + timedelta(seconds=10, milliseconds=1), sent_at=1010.0)  # 1 ms
    monotonic.now = 1020.0
    assert clock.now() == T0 + timedelta(seconds=20, milliseconds=1)


def test_old_readings_age_out_but_the_newest_stays() -> None:
    monotonic = FakeMonotonic()
    clock = DatabaseClock(window=60, monotonic=monotonic)
    clock.observe(T0, sent_at=1000.0)  # the best offset, but old by the next reading
    clock.observe(T0 + timedelta(seconds=100, milliseconds=3), sent_at=1100.0)
    monotonic.now = 1100.0
    assert clock.now() == T0 + timedelta(seconds=100, milliseconds=3)
    monotonic.now = 5000.0  # no reading for a long time: the newest one still counts
    assert clock.now() == T0 + timedelta(seconds=4000, milliseconds=3)


async def test_the_wake_signal_times_out_or_wakes() -> None:
    signal = WakeSignal()
    assert await signal.wait(0.01) is False
    waiting = asyncio.create_task(signal.wait(30))
    await asyncio.sleep(0)
    signal.set()
    assert await asyncio.wait_for(waiting, 1) is True
    assert signal.is_set()
    assert await signal.wait(30) is True  # set before the wait: no wait at all
    signal.clear()
    assert not signal.is_set() and await signal.wait(0) is False
