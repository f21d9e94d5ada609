"""Process helpers shared by the job worker and the pipeline runner: worker ids,
the schema check, the pause between retries of a failing database call, and the
warning about misspelled settings."""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import uuid
from collections.abc import Mapping

from agora_pg.db.store import Store
from agora_pg.errors import ConnectionLost, DatabaseUnavailable, SchemaNotReady, TransientDatabaseError
from agora_pg.settings import unknown_variables

log = logging.getLogger("agora_pg")


class ErrorWait:
    """A pause between retries of a failing call that doubles up to 10 s."""

    MAX_SECONDS = 10.0

    def __init__(self, first_seconds: float) -> None:
        self._first = first_seconds
        self._current = first_seconds

    def next(self) -> float:
        wait = self._current
        self._current = min(self._current * 2, self.MAX_SECONDS)
        return wait

    def reset(self) -> None:
        self._current = self._first

    def after(self, error: BaseException, what: str, logger: logging.Logger = log) -> float:
        """The next pause, once ``what`` failed with ``error`` is logged (a database that
        did not answer as a warning, anything else with its traceback)."""
        wait = self.next()
        if isinstance(error, DatabaseUnavailable):
            logger.warning("%s: %s; retrying in %.1fs", what, error, wait)
        else:
            logger.exception("%s failed; retrying in %.1fs", what, wait)
        return wait


def new_worker_id() -> str:
    """Unique per process start: host and pid for people, a random part for uniqueness."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:12]}"


# How often the start-up schema check is tried when the server answered but the call
# broke (its session was terminated, a transient error): a database that cannot be
# reached at all fails the start at once, with one line.
SCHEMA_CHECK_ATTEMPTS = 5


async def check_schema(store: Store, *, attempts: int = SCHEMA_CHECK_ATTEMPTS) -> None:
    """Raise ``SchemaNotReady`` unless the database is migrated to head.

    A connection lost during the check, or a transient server error, is retried up
    to ``attempts`` times in all (pauses of 0.2 s doubling); a database that cannot be
    reached raises ``DatabaseUnavailable`` at once."""
    pause = ErrorWait(0.2)
    for attempt in range(1, attempts + 1):
        try:
            applied = await store.schema_versions()
            break
        except (ConnectionLost, TransientDatabaseError) as error:
            if attempt == attempts:
                raise
            await asyncio.sleep(pause.after(error, "checking the schema"))
    from agora_pg.db.migrate import head_revisions  # (Alembic loads only here, once)

    head = head_revisions()
    if applied != head:
        state = "not migrated" if not applied else f"at {', '.join(sorted(applied))}"
        raise SchemaNotReady(
            f"the agora schema is {state}, expected {', '.join(sorted(head))}: "
            "run `agora-pg migrate` first"
        )


# A worker allocates a handful of objects per job that the collector must track; with
# CPython 3.11's default first threshold (700) it ran a collection every ~150 jobs,
# 10-20 % of a no-op job's cost. Cyclic garbage is rare in a worker; a higher threshold
# keeps collections (and the memory they free) but makes them rarer.
WORKER_GC_THRESHOLD = 10_000


def tune_garbage_collector() -> None:
    """For a worker process, once started: move the objects of start-up (modules, the
    user's worker module) out of the collector's way, and collect young objects less often."""
    gc.freeze()
    _first, second, third = gc.get_threshold()
    gc.set_threshold(WORKER_GC_THRESHOLD, second, third)


_warned_settings: set[str] = set()  # per process: each unknown variable is named once


def warn_unknown_settings(env: Mapping[str, str] | None = None) -> None:
    """Log a WARNING, once per process, for each ``AGORA_PG_*`` / ``WORKER_*`` variable
    agora-pg does not read, with the closest known name."""
    for line in unknown_variables(os.environ if env is None else env):
        if line not in _warned_settings:
            _warned_settings.add(line)
            log.warning("%s", line)
