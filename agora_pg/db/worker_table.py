"""The ``agora.workers`` statements: registration, leases, stops."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from agora_pg.db import queries
from agora_pg.db.connections import StatementRunner
from agora_pg.db.job_rows import DeclaredKind, KindConflict, LeaseRenewal, UnhandledJobs



# A worker without a heartbeat for this long is not counted as alive (the dashboard's
# list, POST /jobs's warning).
WORKER_ALIVE_SECONDS = 60
RETIRED_TALLIES = "(retired)"  # the process_tallies row that sums the processes gone quiet

class WorkerTable:
    """Reached as ``store.workers``; runs its statements through the Store's connections."""

    def __init__(self, store: StatementRunner) -> None:
        self._store = store

    async def register(self, worker_id: str, hostname: str, pid: int, queues: Sequence[str],
                       kinds: Sequence[str] | None = None) -> None:
        """Record a starting worker, the queues it claims and the kinds it handles."""
        await self._store.execute(queries.INSERT_WORKER, worker_id, hostname, pid, list(queues),
                                  None if kinds is None else sorted(kinds))

    async def declare_kinds(self, worker_id: str, kinds: Mapping[str, DeclaredKind]) -> list[KindConflict]:
        """Worker ``worker_id`` declares its kinds' options (``queries.DECLARE_KINDS``): they
        apply to every job of those kinds enqueued from now on. Returns the kinds whose
        options were another live worker's, and differ."""
        names = sorted(kinds)
        rows = await self._store.fetch(
            queries.DECLARE_KINDS, worker_id, names, [kinds[k].queue for k in names],
            [kinds[k].max_retries for k in names], [kinds[k].timeout_seconds for k in names],
            [kinds[k].retry_backoff_seconds for k in names], float(WORKER_ALIVE_SECONDS))
        return [KindConflict.from_row(row) for row in rows]

    async def kind_conflicts(self, alive_seconds: float = WORKER_ALIVE_SECONDS) -> list[KindConflict]:
        """Live workers that declared other options for a kind than those that apply."""
        return [KindConflict.from_row(row) for row in await self._store.fetch(queries.KIND_CONFLICTS,
                                                                              float(alive_seconds))]

    async def live_handlers_of(self, kind: str, queue: str, alive_seconds: float) -> tuple[bool, list[str]]:
        """Whether a live worker of ``queue`` handles ``kind`` (a worker that does not say
        which kinds it handles counts), and the kinds its live workers handle."""
        [row] = await self._store.fetch(queries.LIVE_HANDLERS_OF, kind, queue, float(alive_seconds))
        return bool(row["handled"]), list(row["kinds"])

    async def unhandled_jobs(self, alive_seconds: float = WORKER_ALIVE_SECONDS) -> list[UnhandledJobs]:
        """Claimable jobs no live worker handles, by queue and kind, most first."""
        return [UnhandledJobs(**dict(row.items()))
                for row in await self._store.fetch(queries.UNHANDLED_JOBS, float(alive_seconds))]

    async def renew_leases(
        self,
        worker_id: str,
        lease_seconds: float,
        jobs: Sequence[tuple[int, int]],
    ) -> LeaseRenewal:
        """Extend the worker's lease (which covers its jobs); of the job attempts ``(id,
        attempt)`` it holds, says which are lost and which are to be cancelled, and which
        jobs it holds without listing them."""
        rows = await self._store.fetch(
            queries.RENEW_LEASES, worker_id, float(lease_seconds),
            [job[0] for job in jobs], [job[1] for job in jobs],
        )
        row = rows[0]
        return LeaseRenewal(
            lost_jobs=frozenset(zip(row["lost_job_ids"], row["lost_job_attempts"], strict=True)),
            cancel_jobs=frozenset(zip(row["cancel_job_ids"], row["cancel_job_attempts"], strict=True)),
            unknown_jobs=frozenset(row["unknown_job_ids"]),
            worker_renewed=row["worker_renewed"],
        )

    async def stop(self, worker_id: str) -> None:
        await self._store.execute(queries.STOP_WORKER, worker_id)

    async def delete_stale(self, older_than_seconds: float) -> None:
        await self._store.execute(queries.DELETE_STALE_WORKERS, float(older_than_seconds))

    async def lease_uncovered_jobs(self, lease_seconds: float) -> None:
        """Give running jobs whose worker's row is gone a lease of their own."""
        await self._store.execute(queries.LEASE_UNCOVERED_JOBS, float(lease_seconds))

    async def settle_leases(self, passed_seconds: float) -> None:
        """Let go of worker leases that passed ``passed_seconds`` ago and cover no job."""
        await self._store.execute(queries.SETTLE_WORKER_LEASES, float(passed_seconds))

    # -- the processes' counters (agora.process_tallies) --------------------------------

    async def add_tallies(self, process_id: str, delta: dict[str, Any],
                          merge: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> None:
        """Add ``delta`` (counters and histograms, as JSON) to the process's row (``merge``
        adds snapshots up)."""
        async with self._store.connection() as connection, connection.transaction():
            row = await connection.fetchrow(queries.TALLIES_FOR_UPDATE, process_id)
            total = merge([json.loads(row["tallies"]), delta]) if row is not None else delta
            await connection.execute(queries.PUBLISH_TALLIES, process_id, json.dumps(total))

    async def retire_tallies(self, silent_seconds: float,
                             merge: Callable[[list[dict[str, Any]]], dict[str, Any]]) -> int:
        """Fold the snapshots of processes silent for ``silent_seconds`` into the retired
        sum (``merge`` adds snapshots up), in one transaction: the total never goes down.
        Returns how many were folded."""
        [row] = await self._store.fetch(queries.ANY_SILENT_TALLIES, float(silent_seconds), RETIRED_TALLIES)
        if not row[0]:
            return 0
        async with self._store.connection() as connection, connection.transaction():
            rows = await connection.fetch(queries.SILENT_TALLIES_FOR_UPDATE, float(silent_seconds), RETIRED_TALLIES)
            silent = [row["process_id"] for row in rows if row["process_id"] != RETIRED_TALLIES]
            if not silent:
                return 0
            total = merge([json.loads(row["tallies"]) for row in rows])
            await connection.execute(queries.PUBLISH_TALLIES, RETIRED_TALLIES, json.dumps(total))
            await connection.execute(queries.DELETE_TALLIES, silent)
        return len(silent)
