"""The server's connection slots shared by the test processes (pytest-xdist workers).

A test that uses the database reserves, before it starts, as many connections as it
opens at most (its own pools and the worker processes it starts): 12 by default, 16
with the ``processes`` fixture, more with ``@pytest.mark.connections(N)``. A test waits
while the others' reservations leave too few slots, in the order the tests asked (so a
test that needs many is not overtaken for ever by small ones). On the embedded server
(400 slots) nothing waits; on a server with PostgreSQL's default of 100 a few large
tests take turns instead of making the server refuse connections ("too many clients
already").

Reservations are files in one directory per server, changed under a lock file; the file
of a test process that died is ignored.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

POLL_SECONDS = 0.05


@dataclass(frozen=True)
class _Entry:
    path: Path
    pid: int
    asked_at: float
    count: int
    holding: bool


class ConnectionBudget:
    """At most ``total`` connections reserved at once by the tests sharing ``directory``."""

    def __init__(self, directory: Path, total: int) -> None:
        self.directory = directory
        self.total = total
        directory.mkdir(parents=True, exist_ok=True)

    @contextlib.contextmanager
    def reserve(self, count: int, timeout: float = 900.0) -> Iterator[None]:
        """Hold ``count`` slots (all of them if ``count`` is more) until the block ends."""
        count = min(count, self.total)
        mine = self.directory / f"{os.getpid()}-{uuid.uuid4().hex}"
        asked_at = time.time()
        self._write(mine, asked_at, count, holding=False)
        try:
            deadline = time.monotonic() + timeout
            while not self._take(mine, asked_at, count):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{count} of the test server's {self.total} connection slots "
                                       f"were not free within {timeout:g}s")
                time.sleep(POLL_SECONDS)
            yield
        finally:
            mine.unlink(missing_ok=True)

    def _take(self, mine: Path, asked_at: float, count: int) -> bool:
        with self._locked():
            entries = [entry for entry in self._entries() if entry.path != mine]
            held = sum(entry.count for entry in entries if entry.holding)
            earlier = any(not entry.holding and (entry.asked_at, entry.path.name) < (asked_at, mine.name)
                          for entry in entries)
            if earlier or held + count > self.total:
                return False
            self._write(mine, asked_at, count, holding=True)
            return True

    def _entries(self) -> list[_Entry]:
        entries = []
        for path in self.directory.iterdir():
            if path.name == "lock" or path.suffix == ".new":
                continue
            try:
                pid, asked_at, count, state = path.read_text().split()
            except (OSError, ValueError):
                continue  # removed meanwhile, or being written
            if not _alive(int(pid)):
                path.unlink(missing_ok=True)
                continue
            entries.append(_Entry(path, int(pid), float(asked_at), int(count), state == "holding"))
        return entries

    @staticmethod
    def _write(path: Path, asked_at: float, count: int, *, holding: bool) -> None:
        staged = path.with_name(path.name + ".new")
        staged.write_text(f"{os.getpid()} {asked_at!r} {count} {'holding' if holding else 'waiting'}")
        staged.rename(path)  # read whole or not at all

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        with open(self.directory / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            yield


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
