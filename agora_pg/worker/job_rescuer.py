"""Takes back jobs whose worker went silent (its lease passed)."""

from __future__ import annotations

import logging
import time

from agora_pg.db.store import Store

log = logging.getLogger("agora_pg.worker")

STALE_WORKER_SECONDS = 7 * 24 * 3600  # forget worker rows silent for a week
SETTLE_LEASE_SECONDS = 3600  # stop looking at a worker lease an hour after it passed, once it covers no job
# Look for running jobs whose worker's row is gone this often (a scan of the running jobs:
# 14 ms at 50,000 of them, so rarely).
UNCOVERED_EVERY_SECONDS = 600.0
BATCH = 1000


class JobRescuer:
    """``run_once()`` rescues the jobs of every passed lease (a worker's, or a job's own)
    and returns the job ids. A rescued attempt counts as lost (``lost_count``), not failed:
    the job is due again at once, until ``max_lost_attempts`` lost attempts fail it.
    Every ``UNCOVERED_EVERY_SECONDS`` it also gives running jobs whose worker's row is gone
    a lease of their own of ``lease_seconds`` (otherwise no lease would ever pass for them)."""

    def __init__(
        self, store: Store, max_lost_attempts: int, default_max_retries: int, *, lease_seconds: float = 30.0
    ) -> None:
        self._store = store
        self._max_lost_attempts = max_lost_attempts
        self._default_max_retries = default_max_retries
        self._lease_seconds = lease_seconds
        self._uncovered_due = 0.0  # time.monotonic() of the next look for uncovered jobs

    async def run_once(self) -> list[int]:
        if time.monotonic() >= self._uncovered_due:
            await self._store.workers.lease_uncovered_jobs(self._lease_seconds)
            self._uncovered_due = time.monotonic() + UNCOVERED_EVERY_SECONDS
        rescued: list[int] = []
        while True:
            batch = await self._store.jobs.rescue_expired(self._max_lost_attempts, self._default_max_retries, BATCH,
                                                           lease_seconds=self._lease_seconds)
            rescued.extend(batch)
            if len(batch) < BATCH:
                break
        if rescued:
            log.warning("rescued %d job(s) from lost workers: %s", len(rescued), rescued[:20])
        await self._store.workers.settle_leases(SETTLE_LEASE_SECONDS)
        await self._store.workers.delete_stale(STALE_WORKER_SECONDS)
        return rescued
