"""Records the outcome of finished attempts, many per statement."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random

from agora_pg.db.store import Store
from agora_pg.jobs import Job
from agora_pg.retry import BackoffPolicy, decide, describe_error

log = logging.getLogger("agora_pg.worker")


@dataclasses.dataclass(frozen=True)
class Outcome:
    """How one attempt ended: ``error`` is None on success."""

    job: Job
    error: BaseException | None = None


@dataclasses.dataclass(frozen=True)
class FlushResult:
    succeeded: int
    failed: int
    superseded: list[int]  # job ids whose attempt had been taken over meanwhile


class Completer:
    """Collects outcomes from handler tasks and writes them in batches.

    Each flush writes all successes in one statement and all failures in
    another, each with its ``agora.runs`` rows, fenced on the attempt.
    """

    def __init__(
        self,
        store: Store,
        worker_id: str,
        default_max_retries: int,
        backoff: BackoffPolicy,
        rng: random.Random,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._default_max_retries = default_max_retries
        self._backoff = backoff
        self._rng = rng
        self._pending: list[Outcome] = []
        self.has_pending = asyncio.Event()

    def add(self, outcome: Outcome) -> None:
        self._pending.append(outcome)
        self.has_pending.set()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    async def flush_once(self) -> FlushResult:
        """Write every outcome collected so far. On a database error the
        outcomes are kept for the next flush and the error propagates."""
        batch, self._pending = self._pending, []
        self.has_pending.clear()
        successes = [(o.job.id, o.job.attempt) for o in batch if o.error is None]
        failures = [self._failure_row(o.job, o.error) for o in batch if o.error is not None]
        written: set[int] = set()
        unwritten = batch
        try:
            if successes:
                written |= await self._store.complete_succeeded(successes, self._worker_id)
                unwritten = [o for o in batch if o.error is not None]
            if failures:
                written |= await self._store.complete_failed(
                    failures, self._worker_id, self._default_max_retries
                )
                unwritten = []
        except BaseException:
            # Keep what was not written for the next flush; fencing makes a repeat harmless.
            self._pending = unwritten + self._pending
            self.has_pending.set()
            raise
        superseded = [o.job.id for o in batch if o.job.id not in written]
        for job_id in superseded:
            log.warning("job %s: attempt was taken over by another worker; outcome not recorded", job_id)
        return FlushResult(len(successes), len(failures), superseded)

    def _failure_row(self, job: Job, error: BaseException) -> tuple[int, int, str, str, float]:
        max_retries = job.max_retries if job.max_retries is not None else self._default_max_retries
        decision = decide(job.retry_count + 1, max_retries, error, self._backoff, self._rng)
        error_type, message = describe_error(error)
        return (job.id, job.attempt, error_type, message, decision.delay_seconds if decision else 0.0)
