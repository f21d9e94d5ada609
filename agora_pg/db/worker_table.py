"""The ``agora.workers`` statements: registration, leases, stops."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from agora_pg.db import queries
from agora_pg.db.job_rows import LeaseRenewal

if TYPE_CHECKING:
    from agora_pg.db.store import Store


class WorkerTable:
    """Reached as ``store.workers``; runs its statements through the Store's connections."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def register(
        self, worker_id: str, hostname: str, pid: int, queues: Sequence[str], *, runs_pipelines: bool = False
    ) -> None:
        """Record a starting worker: its job worker (``queues``) or, with
        ``runs_pipelines``, its scheduled pipelines; the second call adds to the row."""
        await self._store.execute(queries.INSERT_WORKER, worker_id, hostname, pid, list(queues), runs_pipelines)

    async def renew_leases(
        self,
        worker_id: str,
        lease_seconds: float,
        jobs: Sequence[tuple[int, int]],
        runs: Sequence[tuple[str, int]],
    ) -> LeaseRenewal:
        """Extend the worker's lease (which covers its jobs) and exactly these pipeline-run
        leases ``(id, run_id)``; of the job attempts ``(id, attempt)`` it holds, says which are
        lost and which are to be cancelled, and which jobs it holds without listing them."""
        rows = await self._store.fetch(
            queries.RENEW_LEASES, worker_id, float(lease_seconds),
            [job[0] for job in jobs], [job[1] for job in jobs], [run[0] for run in runs], [run[1] for run in runs],
        )
        row = rows[0]
        return LeaseRenewal(
            lost_jobs=frozenset(zip(row["lost_job_ids"], row["lost_job_attempts"], strict=True)),
            cancel_jobs=frozenset(zip(row["cancel_job_ids"], row["cancel_job_attempts"], strict=True)),
            lost_runs=frozenset(row["lost_runs"]),
            unknown_jobs=frozenset(row["unknown_job_ids"]),
            worker_renewed=row["worker_renewed"],
        )

    async def live_pipeline_workers(self, lease_seconds: float) -> tuple[list[str], datetime, float]:
        """The ids of the workers running scheduled pipelines whose lease is live, or
        which started less than ``lease_seconds`` ago and have not renewed it yet; and a
        reading of the database clock (as ``read_database_clock``)."""
        async with self._store.connection() as connection:
            sent_at = time.monotonic()
            row = await connection.fetchrow(queries.LIVE_PIPELINE_WORKERS, float(lease_seconds))
        assert row is not None
        return list(row["ids"]), row["database_now"], sent_at

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
