"""The test suite's sharing of the server's connection slots (tests/connection_budget.py)."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.connection_budget import ConnectionBudget


def _hold(budget: ConnectionBudget, count: int, seconds: float, log: list[tuple[str, int]], name: str,
          release: threading.Event | None = None) -> None:
    with budget.reserve(count):
        log.append(("start", count))
        if release is not None:
            release.wait(10)
        time.sleep(seconds)
        log.append(("end", count))


def test_reservations_never_exceed_the_total_and_are_served_in_order(tmp_path: Path) -> None:
    budget = ConnectionBudget(tmp_path, total=10)
    log: list[tuple[str, int]] = []
    threads = []
    asked_all = threading.Event()  # 6 holds until all three have asked
    # 8 waits for 6; 3 would fit beside 6 but asked after 8, and does not fit beside 8: it
    # starts after 8 has ended, whatever the timing (with 2, which fits beside 8, the two
    # could start together, and the log would show them in either order)
    for count in (6, 8, 3):
        thread = threading.Thread(target=_hold, args=(budget, count, 0.1, log, str(count),
                                                       asked_all if count == 6 else None))
        thread.start()
        threads.append(thread)
        # (each has asked before the next starts: a busy machine may run a new thread late)
        deadline = time.monotonic() + 10
        while not any(entry.count == count for entry in budget._entries()) and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(0.2)  # (3 would take its slots now, beside 6, if it did not wait its turn)
    asked_all.set()
    for thread in threads:
        thread.join(15)
    assert [entry for entry in log if entry[0] == "start"] == [("start", 6), ("start", 8), ("start", 3)]
    held = 0
    for event, count in log:
        held += count if event == "start" else -count
        assert held <= 10


def test_a_reservation_of_a_dead_process_frees_its_slots(tmp_path: Path) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / f"{dead.pid}-stale").write_text(f"{dead.pid} 0.0 10 holding")
    budget = ConnectionBudget(tmp_path, total=10)
    with budget.reserve(10, timeout=2):
        assert not (tmp_path / f"{dead.pid}-stale").exists()


def test_a_reservation_that_cannot_be_had_says_so(tmp_path: Path) -> None:
    budget = ConnectionBudget(tmp_path, total=4)
    with budget.reserve(3):
        with pytest.raises(TimeoutError, match="2 of the test server's 4 connection slots"):
            with budget.reserve(2, timeout=0.2):
                pass
    with budget.reserve(50, timeout=1):  # more than the total: the whole server, alone
        assert budget.total == 4
