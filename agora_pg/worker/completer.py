"""Records the outcomes of finished attempts, many per statement.

The one door every attempt leaves by: ``add(attempt, outcome)``. Successes are
written in one statement, every other outcome in another (``FINISH_JOBS``), each
fenced on the attempt. The call that writes successes also claims the worker's next
jobs when its ``Claimer`` asks (``agora.complete_and_claim``: one round trip and one
commit for both). An outcome is kept, and its lease renewed, until it is written;
then its lease token is released. A statement that fails on its data
(which ``outcomes`` makes all but impossible) is split, and an outcome that still
cannot be stored is written in a minimal form, so one bad outcome never loses the
others or stops the worker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
from collections.abc import Awaitable, Callable

from agora_pg.db.job_rows import JobFinish
from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.outcomes import MAX_ERROR_MESSAGE, Outcome, OutcomeKind, storable_text
from agora_pg.retry import BackoffPolicy, decide
from agora_pg.runtime.leases import LeaseSupervisor
from agora_pg.runtime.process_metrics import PROCESS_METRICS
from agora_pg.settings import Settings
from agora_pg.worker.attempts import Attempt

log = logging.getLogger("agora_pg.worker")


@dataclasses.dataclass(frozen=True)
class FlushResult:
    written: int
    superseded: list[int]  # job ids whose attempt had been taken over meanwhile


# The worker, as the completer claims for it: records successes ``(job id, attempt)``
# with their results and claims the slots they free, in one call; returns the ids
# recorded, or None when it claims nothing now (the successes are then recorded alone).
Claimer = Callable[[list[tuple[int, int]], dict[int, str]], Awaitable[set[int] | None]]


# The run status each outcome this worker writes leaves (a lost attempt's, "abandoned",
# is also what a rescue by another worker writes: it tells nothing).
_RUN_STATUS = {OutcomeKind.SUCCEEDED: "succeeded", OutcomeKind.FAILED: "failed",
               OutcomeKind.CANCELLED: "cancelled", OutcomeKind.RELEASED: "cancelled"}


class Completer:
    """Collects outcomes from attempts and writes them in batches; ``on_settled`` is told
    of the attempts whose outcome is settled (written, or taken over by another worker)."""

    def __init__(
        self,
        store: Store,
        worker_id: str,
        settings: Settings,
        supervisor: LeaseSupervisor | None,
        rng: random.Random,
        on_settled: Callable[[list[Attempt]], None] | None = None,
        claimer: Claimer | None = None,
    ) -> None:
        self._store = store
        self._worker_id = worker_id
        self._default_max_retries = settings.max_retries
        self._max_lost_attempts = settings.max_lost_attempts
        self._backoff = BackoffPolicy(settings.retry_backoff_seconds, settings.retry_backoff_max_seconds)
        self._supervisor = supervisor
        self._rng = rng
        self._on_settled = on_settled
        self._claimer = claimer
        self._pending: list[Attempt] = []  # finished attempts, each with its outcome
        self._writing = 0  # outcomes in the statement being written now
        self.has_pending = asyncio.Event()

    def add(self, attempt: Attempt) -> None:
        """Record ``attempt.outcome`` with the next flush."""
        self._pending.append(attempt)
        self.has_pending.set()

    @property
    def pending_count(self) -> int:
        return len(self._pending)

    @property
    def unrecorded(self) -> int:
        """Finished attempts whose outcome is not written yet (waiting or being written):
        they keep their concurrency slots, so that what a worker holds in memory, and
        what would run again if it died, is bounded by its concurrency."""
        return len(self._pending) + self._writing

    async def flush_once(self) -> FlushResult:
        """Write every outcome collected so far. On ``DatabaseUnavailable`` the unwritten
        outcomes are kept for the next flush and the error propagates."""
        batch, self._pending = self._pending, []
        self.has_pending.clear()
        self._writing = len(batch)
        try:
            return await self._flush(batch)
        finally:
            self._writing = 0

    async def _flush(self, batch: list[Attempt]) -> FlushResult:
        try:
            written = await self._write(batch)
        except asyncio.CancelledError:  # (a deadline at shutdown): nothing is lost
            self._keep(batch)
            raise
        except Exception as error:
            if isinstance(error, DatabaseUnavailable):
                self._keep(batch)
                raise
            log.error("recording %d outcome(s) failed (%s: %s); recording them one by one",
                      len(batch), type(error).__name__, error)
            written = set()
            for index, attempt in enumerate(batch):
                try:
                    written |= await self._write_alone(attempt)
                except (DatabaseUnavailable, asyncio.CancelledError):
                    self._keep(batch[index:])
                    self._settle(batch[:index], written)
                    raise
        if len(written) < len(batch):
            written |= await self._recorded_before(batch, written)
        return self._settle(batch, written)

    async def _recorded_before(self, batch: list[Attempt], written: set[int]) -> set[int]:
        """Of the attempts a write left alone, those whose outcome is recorded already, as
        this worker would have recorded it: an earlier write of theirs committed but its
        reply was lost (cut off at shutdown, or by the network), so they were written
        again and fenced. Their outcome is recorded: no warning is due."""
        missed = [attempt for attempt in batch if attempt.job.id not in written and attempt.outcome is not None
                  and attempt.outcome.kind in _RUN_STATUS]
        if not missed:
            return set()
        try:
            statuses = await self._store.runs.statuses_of_attempts([(a.job.id, a.job.attempt) for a in missed])
        except Exception as error:  # (only a log line depends on it)
            log.debug("checking %d fenced outcome(s): %s", len(missed), error)
            return set()
        return {attempt.job.id for attempt in missed
                if attempt.outcome is not None
                and statuses.get((attempt.job.id, attempt.job.attempt)) == _RUN_STATUS[attempt.outcome.kind]}

    def _keep(self, entries: list[Attempt]) -> None:
        self._pending = entries + self._pending
        self.has_pending.set()

    def _settle(self, entries: list[Attempt], written: set[int]) -> FlushResult:
        if self._supervisor is not None:
            self._supervisor.release(entries)
        if self._on_settled is not None:
            self._on_settled(entries)
        _count_recorded(entries, written)
        superseded = [attempt for attempt in entries if attempt.job.id not in written]
        for attempt in superseded:
            log.warning("%s: the attempt was taken over by another worker; its outcome is not recorded",
                        attempt.description)
        return FlushResult(len(entries) - len(superseded), [attempt.job.id for attempt in superseded])

    async def _write(self, entries: list[Attempt]) -> set[int]:
        successes: list[tuple[int, int]] = []
        results: dict[int, str] = {}
        others: list[JobFinish] = []
        for attempt in entries:
            assert attempt.outcome is not None
            if attempt.outcome.kind is OutcomeKind.SUCCEEDED:
                successes.append((attempt.job.id, attempt.job.attempt))
                if attempt.outcome.result is not None:
                    results[attempt.job.id] = attempt.outcome.result
            else:
                others.append(self._finish_row(attempt, attempt.outcome))
        written: set[int] = set()
        if successes:
            recorded = await self._claimer(successes, results) if self._claimer is not None else None
            written |= recorded if recorded is not None else await self._store.jobs.complete_succeeded(
                successes, self._worker_id, results)
        if others:
            written |= await self._store.jobs.finish(
                others, self._worker_id, self._max_lost_attempts, self._default_max_retries
            )
        return written

    async def _write_alone(self, attempt: Attempt) -> set[int]:
        outcome = attempt.outcome
        assert outcome is not None
        try:
            return await self._write([attempt])
        except DatabaseUnavailable:
            raise
        except Exception as error:
            message = storable_text(
                f"OutcomeNotStorable: the attempt's outcome ({outcome.kind.value}, {outcome.error_type}) "
                f"could not be stored: {type(error).__name__}", MAX_ERROR_MESSAGE,
            )
            log.error("%s: %s", attempt.description, message)
            kind = OutcomeKind.FAILED if outcome.kind is OutcomeKind.SUCCEEDED else outcome.kind
            attempt.outcome = Outcome(kind, "OutcomeNotStorable", message)
            try:
                return await self._write([attempt])
            except DatabaseUnavailable:
                raise
            except Exception:
                log.exception("%s: even a minimal outcome could not be stored; its lease will expire",
                              attempt.description)
                return set()

    def _finish_row(self, attempt: Attempt, outcome: Outcome) -> JobFinish:
        job = attempt.job
        delay, final = 0.0, outcome.final
        if outcome.kind is OutcomeKind.FAILED and not final:
            max_retries = next(value for value in (job.max_retries, attempt.options.max_retries,
                                                   self._default_max_retries) if value is not None)
            backoff = self._backoff
            if attempt.options.retry_backoff is not None:  # the kind's own base delay
                backoff = dataclasses.replace(backoff, base_seconds=attempt.options.retry_backoff)
            decision = decide(job.retry_count + 1, max_retries, backoff, self._rng, outcome.retry_after)
            delay = max(decision.delay_seconds, outcome.retry_at_least) if decision is not None else 0.0
        return JobFinish(
            job_id=job.id, attempt=job.attempt, kind=outcome.kind.value, error_type=outcome.error_type,
            error_message=outcome.error_message, traceback=outcome.traceback, delay_seconds=delay, final=final,
        )


def _count_recorded(entries: list[Attempt], written: set[int]) -> None:
    """Count the outcomes written for ``/metrics`` (``PROCESS_METRICS``)."""
    PROCESS_METRICS.jobs_recorded(
        (job.queue, job.kind, outcome.kind.value,
         attempt.ended_at - attempt.claimed_at,
         (job.started_at - job.run_at).total_seconds() if job.started_at is not None else None)
        for attempt in entries
        if (job := attempt.job).id in written and (outcome := attempt.outcome) is not None
    )
