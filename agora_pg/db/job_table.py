"""The ``agora.jobs`` statements: enqueue, read, cancel, retry, claim, record outcomes, rescue."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence, Set
from datetime import datetime
from typing import Any, cast

import asyncpg
import asyncpg.pool

from agora_pg.db import queries
from agora_pg.db.connections import StatementRunner
from agora_pg.db.enqueue import CallerConnection, caller_fetch, insert_jobs
from agora_pg.db.job_rows import JobFinish, Promotion, row_to_job
from agora_pg.errors import (
    InvalidTransition,
    JobConflict,
    JobNotFound,
)
from agora_pg.job_spec import JobSpec
from agora_pg.jobs import Job, JobStatus, possible_job_id
from agora_pg.limits import KindLimit, QueueLimit


class JobTable:
    """Reached as ``store.jobs``; runs its statements through the Store's connections."""

    def __init__(self, store: StatementRunner) -> None:
        self._store = store

    async def enqueue(
        self,
        specs: Sequence[JobSpec],
        connection: CallerConnection | None = None,
    ) -> list[tuple[Job, bool]]:
        """Insert jobs (each with its kind's declared options where it sets none: see
        ``agora.kinds``); returns each job with ``True`` if it was inserted or ``False``
        if a live job with its dedup_key was returned instead."""
        if not specs:
            return []
        if connection is not None:
            return await insert_jobs(caller_fetch(connection), specs)
        async with self._store.connection() as own:
            return await insert_jobs(own.fetch, specs)

    async def get(self, job_id: int) -> Job:
        require_possible_job_id(job_id)
        rows = await self._store.fetch(queries.SELECT_JOB, job_id)
        if not rows:
            raise JobNotFound(job_id)
        return row_to_job(rows[0])

    async def cancel(self, job_id: int) -> Job:
        """Cancel a job that has not started yet, or ask the worker running it to stop it
        (the job is returned still ``processing``, with ``cancel_requested_at`` set)."""
        require_possible_job_id(job_id)
        return await self._changed(await self._store.fetch(queries.CANCEL_JOB, job_id), job_id, JobStatus.CANCELLED)

    async def search(self, filters: Mapping[str, Any], limit: int) -> list[Job]:
        """Jobs newest first; ``filters`` maps names of ``queries.JOB_FILTERS`` to values
        (``before_id`` pages: the jobs older than that id)."""
        names = [name for name in queries.JOB_FILTERS if filters.get(name) is not None]
        rows = await self._store.fetch(queries.list_jobs(names), *(filters[name] for name in names), limit)
        return [row_to_job(row) for row in rows]

    async def retry(self, job_id: int) -> Job:
        """Put a failed or cancelled job back to pending, due now."""
        require_possible_job_id(job_id)
        try:
            rows = await self._store.fetch(queries.RETRY_JOB, job_id)
        except asyncpg.UniqueViolationError:
            raise JobConflict(job_id, "another live job holds its dedup_key") from None
        return await self._changed(rows, job_id, JobStatus.PENDING)

    async def _changed(self, rows: Sequence[asyncpg.Record], job_id: int, to: JobStatus) -> Job:
        """The job a statement changed to ``to`` (its rows), else ``InvalidTransition``."""
        if rows:
            return row_to_job(rows[0])
        raise InvalidTransition(job_id, (await self.get(job_id)).status.value, to.value)

    async def claim(
        self, queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float, *, kinds: Sequence[str],
        suspects: bool = True, suspect_lost: int = 1, timeout: float | None = None,
    ) -> list[Job]:
        """Claim up to ``limit`` due jobs of ``queues`` and ``kinds`` (those the worker
        handles), highest priority first. Of the jobs that lost ``suspect_lost`` attempts
        or more, at most one, and none without ``suspects``. A claim not answered within
        ``timeout`` seconds is cancelled (``DatabaseUnavailable``)."""
        rows = await self._store.fetch(queries.CLAIM_JOBS, list(queues), limit, worker_id, float(lease_seconds),
                                       suspects, suspect_lost, list(kinds), timeout=timeout)
        return _in_claim_order(rows)

    async def claim_limited(
        self, queues: Sequence[str], limit: int, worker_id: str, lease_seconds: float, kinds: Sequence[str],
        scan: int, after_key: str | None = None, timeout: float | None = None,
    ) -> tuple[list[Job], str | None]:
        """Claim up to ``limit`` due jobs of ``kinds`` in ``queues`` that a limit applies to,
        within every limit (``queries.CLAIM_LIMITED_JOBS``; ``scan``: how many of a limited
        kind's to look at per queue). Returns them and the last key of fair share served."""
        rows = await self._store.fetch(
            queries.CLAIM_LIMITED_JOBS, list(queues), list(kinds), scan, limit, worker_id, float(lease_seconds),
            after_key, timeout=timeout,
        )
        keys = {row["fair_key"] for row in rows} - {None}
        return _in_claim_order(rows), last_key_served(keys, after_key) if keys else after_key

    async def declare_queue_limits(self, limits: Mapping[str, QueueLimit], *, config: bool = False) -> list[str]:
        """Write the limits of these queues (``QueueLimit()``: the queue's row is removed),
        as ``declare_limits`` does for kinds; returns the config-declared queues released."""
        queues = sorted(limits)
        rates = [limits[q].rate for q in queues]
        async with self._store.connection() as connection, connection.transaction():
            await connection.execute(
                queries.DECLARE_QUEUE_LIMITS, queues, [limits[q].concurrency for q in queues],
                [rate[0] if rate else None for rate in rates], [float(rate[1]) if rate else None for rate in rates],
                "config" if config else "code")
            if not config:
                return []
            rows = await connection.fetch(queries.RELEASE_CONFIG_QUEUE_LIMITS, queues)
        return sorted(row["queue"] for row in rows)

    async def limited_queues(self, queues: Sequence[str] | None) -> dict[str, QueueLimit]:
        """Those of ``queues`` (None: every queue) that have limits, and their limits."""
        rows = await self._store.fetch(queries.LIMITED_QUEUES, None if queues is None else list(queues))
        return {row["queue"]: queue_limit_of(row) for row in rows}

    async def declare_limits(self, limits: Mapping[str, KindLimit], *, config: bool = False) -> list[str]:
        """Write the flow control of these kinds (a kind with none has its row removed), and
        give their waiting jobs the key of fair share it asks for. A worker declares the
        kinds it handles, and leaves alone those an agora/v1 config declared; ``config``
        declares a config's ``[kinds]`` (they win) and removes the config-declared rows of
        kinds it no longer lists, which it returns."""
        kinds = sorted(limits)
        rates = [limits[k].rate for k in kinds]
        released: list[str] = []
        async with self._store.connection() as connection, connection.transaction():
            await connection.execute(
                queries.DECLARE_KIND_LIMITS, kinds, [limits[k].concurrency for k in kinds],
                [limits[k].limit_by for k in kinds], [rate[0] if rate else None for rate in rates],
                [float(rate[1]) if rate else None for rate in rates], [limits[k].fair_by for k in kinds],
                "config" if config else "code",
            )
            if config:
                released = [row["kind"] for row in await connection.fetch(queries.RELEASE_CONFIG_LIMITS, kinds)]
            await connection.execute(queries.KEY_WAITING_JOBS, kinds)
        return sorted(released)

    async def next_rate_room(self, kinds: Sequence[str], queues: Sequence[str] = ()) -> float | None:
        """Seconds until a start counted by the rate limits of ``kinds`` or ``queues``
        leaves its window (None: none is counted)."""
        rows = await self._store.fetch(queries.NEXT_RATE_ROOM, list(kinds), list(queues))
        return cast("float | None", rows[0][0])

    async def limited_kinds(self, kinds: Sequence[str]) -> dict[str, bool]:
        """Those of ``kinds`` that have a limit, as any worker declared it: kind -> whether
        one of its limits is a rate limit."""
        return {row["kind"]: row["rated"] for row in await self._store.fetch(queries.LIMITED_KINDS, list(kinds))}

    async def complete_succeeded(
        self, attempts: Sequence[tuple[int, int]], worker_id: str, results: Mapping[int, str] | None = None
    ) -> set[int]:
        """Mark ``(job_id, attempt)`` pairs done, recording ``results[job_id]`` (JSON text)
        where given; returns the ids that were still held. Rows are locked in id order, as
        by every outcome statement, so they cannot deadlock."""
        attempts = sorted(attempts)
        results = results or {}
        rows = await self._store.fetch(
            queries.COMPLETE_SUCCEEDED, [a[0] for a in attempts], [a[1] for a in attempts], worker_id,
            [results.get(a[0]) for a in attempts],
        )
        return {row["job_id"] for row in rows}

    async def complete_and_claim(
        self, attempts: Sequence[tuple[int, int]], worker_id: str, results: Mapping[int, str], *,
        queues: Sequence[str], limit: int, lease_seconds: float, kinds: Sequence[str], suspects: bool = True,
        suspect_lost: int = 1, timeout: float | None = None,
    ) -> tuple[set[int], list[Job]]:
        """``complete_succeeded`` and ``claim`` in one call, one commit
        (``queries.COMPLETE_AND_CLAIM``): the ids still held whose outcome is
        recorded, and the jobs claimed. If it raises, neither happened, or (its reply
        lost) both did."""
        attempts = sorted(attempts)
        rows = await self._store.fetch(
            queries.COMPLETE_AND_CLAIM, [a[0] for a in attempts], [a[1] for a in attempts], worker_id,
            [results.get(a[0]) for a in attempts], list(queues), limit, float(lease_seconds), suspects,
            suspect_lost, list(kinds), timeout=timeout,
        )
        claimed = [row["job"] for row in rows if row["job"] is not None]
        return {row["recorded_id"] for row in rows if row["recorded_id"] is not None}, _in_claim_order(claimed)

    async def finish(
        self, finishes: Sequence[JobFinish], worker_id: str, max_lost_attempts: int, default_max_retries: int
    ) -> set[int]:
        """Record outcomes other than success (``queries.FINISH_JOBS``); returns the ids
        of the attempts that were still held (the others were taken over meanwhile)."""
        finishes = sorted(finishes, key=lambda finish: finish.job_id)
        rows = await self._store.fetch(
            queries.FINISH_JOBS, worker_id, max_lost_attempts, default_max_retries,
            [f.job_id for f in finishes], [f.attempt for f in finishes], [f.kind for f in finishes],
            [f.error_type for f in finishes], [f.error_message for f in finishes],
            [f.traceback for f in finishes], [f.delay_seconds for f in finishes], [f.final for f in finishes],
        )
        return {row["id"] for row in rows}

    async def release_claimed(self, worker_id: str, attempts: Sequence[tuple[int, int]]) -> set[int]:
        """Give back claimed ``(job_id, attempt)`` pairs this worker will not start, uncounted."""
        rows = await self._store.fetch(queries.RELEASE_CLAIMED_JOBS, worker_id, [a[0] for a in attempts],
                                       [a[1] for a in attempts])
        return {row["id"] for row in rows}

    async def release_unstarted(self, worker_id: str, running: Sequence[int]) -> set[int]:
        """Give back the jobs ``worker_id`` holds but never started (``running``: ids to keep)."""
        return {row["id"] for row in await self._store.fetch(queries.RELEASE_UNSTARTED_JOBS, worker_id, list(running))}

    async def adopt_unknown(self, worker_id: str, known: Sequence[int], lease_seconds: float) -> list[Job]:
        """The jobs ``worker_id`` holds beyond ``known`` (a claim whose reply was lost)."""
        rows = await self._store.fetch(queries.ADOPT_UNKNOWN_JOBS, worker_id, list(known), float(lease_seconds))
        return [row_to_job(row) for row in rows]

    async def promote_due(self, limit: int) -> Promotion:
        """Move up to ``limit`` delayed jobs whose run_at has passed into the claim index."""
        [row] = await self._store.fetch(queries.PROMOTE_DUE_JOBS, limit)
        return Promotion(row["promoted"], row["next_in_seconds"])

    async def rescue_expired(self, max_lost_attempts: int, default_max_retries: int, limit: int, *,
                             lease_seconds: float) -> list[int]:
        """Take back processing jobs whose lease passed (their worker's, or their own, of
        ``lease_seconds``); returns their ids."""
        rows = await self._store.fetch(queries.RESCUE_EXPIRED, limit, max_lost_attempts, default_max_retries,
                                       float(lease_seconds))
        return [row["id"] for row in rows]

    async def cancel_requested(self, job_ids: Sequence[int]) -> set[int]:
        """Those of ``job_ids`` whose cancel was asked for."""
        return {row["id"] for row in await self._store.fetch(queries.CANCEL_REQUESTED, list(job_ids))}

    async def report_progress(self, worker_id: str, reports: Sequence[tuple[int, int, str]]) -> None:
        """Store and publish the latest progress (JSON) of attempts ``(job_id, attempt)`` this
        worker still holds (``queries.REPORT_JOB_PROGRESS``)."""
        await self._store.fetch(queries.REPORT_JOB_PROGRESS, worker_id, [r[0] for r in reports],
                                [r[1] for r in reports], [r[2] for r in reports])

    async def count_work_due_now(self, queues: Sequence[str], default_max_retries: int) -> int:
        """Jobs of ``queues`` running, or claimable and due now."""
        return cast(int, (await self._store.fetch(queries.COUNT_WORK_DUE_NOW, list(queues), default_max_retries))[0][0])

    async def finished_since(self, since: datetime) -> list[tuple[Job, Any]]:
        """Jobs with an attempt that ended at or after ``since`` (by the database's clock),
        each with its result (None unless an attempt succeeded and returned one)."""
        finished = []
        for row in await self._store.fetch(queries.JOBS_FINISHED_SINCE, since):
            fields = dict(row.items())
            result = fields.pop("result")
            finished.append((row_to_job(fields), None if result is None else json.loads(result)))
        return finished


def last_key_served(keys: Set[str], after_key: str | None) -> str:
    """Of the (non-empty) ``keys`` a claim served, visiting keys in order from the one
    after ``after_key`` and wrapping around, the one it served last. (Python orders text
    by code point, as the column's "C" collation orders its UTF-8 bytes.)"""
    wrapped = [key for key in keys if after_key is not None and key <= after_key]
    return max(wrapped) if wrapped else max(keys)


def _in_claim_order(rows: Sequence[Mapping[str, Any]]) -> list[Job]:
    """Claimed rows as jobs, highest priority first, then by run_at and id (an UPDATE
    returns its rows in no particular order)."""
    return sorted((row_to_job(row) for row in rows), key=lambda job: (-job.priority, job.run_at, job.id))


def require_possible_job_id(job_id: int) -> None:
    """``JobNotFound`` for an id no job can have (not a bigint): no statement is sent."""
    if not possible_job_id(job_id):
        raise JobNotFound(job_id)


def queue_limit_of(row: Mapping[str, Any]) -> QueueLimit:
    """The limits of a row of ``agora.queue_limits``."""
    rate = None if row["rate"] is None else (row["rate"], row["rate_seconds"])
    return QueueLimit(row["concurrency"], rate)
