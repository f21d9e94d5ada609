"""The ``agora.workers`` statements: registration, leases, stops."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from agora_pg.db import queries
from agora_pg.db.job_rows import LeaseRenewal

if TYPE_CHECKING:
    from agora_pg.db.store import Store


class WorkerTable:
    """Reached as ``store.workers``; runs its statements through the Store's connections."""

    def __init__(self, store: Store) -> None:
        self._store = store

    async def register(self, worker_id: str, hostname: str, pid: int, queues: Sequence[str]) -> None:
        """Record a starting worker and the queues it claims."""
        await self._store.execute(queries.INSERT_WORKER, worker_id, hostname, pid, list(queues))

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
