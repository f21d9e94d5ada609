"""The ``agora.runs`` statements: run history and a pipeline run's progress."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from agora_pg.db import queries
from agora_pg.db.connections import StatementRunner
from agora_pg.db.job_table import require_possible_job_id
from agora_pg.db.run_rows import RunRow



class RunTable:
    """Reached as ``store.runs``; runs its statements through the Store's connections."""

    def __init__(self, store: StatementRunner) -> None:
        self._store = store

    async def of_job(self, job_id: int) -> list[RunRow]:
        """Every recorded attempt of a job, oldest first."""
        require_possible_job_id(job_id)
        return [RunRow.from_row(row) for row in await self._store.fetch(queries.SELECT_JOB_RUNS, job_id)]

    async def statuses_of_attempts(self, attempts: Sequence[tuple[int, int]]) -> dict[tuple[int, int], str]:
        """The run status recorded for each ``(job_id, attempt)`` that has a run row."""
        rows = await self._store.fetch(
            queries.RUN_STATUSES_OF_ATTEMPTS, [a[0] for a in attempts], [a[1] for a in attempts])
        return {(row["job_id"], row["attempt"]): row["status"] for row in rows}

    async def search(self, filters: Mapping[str, Any], limit: int) -> list[RunRow]:
        """Runs newest first; ``filters`` maps names of ``queries.RUN_FILTERS`` to values."""
        names = [name for name in queries.RUN_FILTERS if filters.get(name) is not None]
        rows = await self._store.fetch(queries.list_runs(names), *(filters[name] for name in names), limit)
        return [RunRow.from_row(row) for row in rows]
