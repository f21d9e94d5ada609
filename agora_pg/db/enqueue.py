"""Enqueueing on any kind of connection: the Store's own, or the caller's (so that a
job commits or rolls back with the caller's transaction)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import UTC
from typing import Any, TypeAlias, cast

import asyncpg
import asyncpg.pool
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from agora_pg.db import queries
from agora_pg.db.job_rows import inserted_job, new_job, row_to_job
from agora_pg.job_spec import JobSpec, batch_columns
from agora_pg.jobs import Job

# What a caller may pass so that an enqueue joins its own transaction.
CallerConnection: TypeAlias = "asyncpg.Connection | asyncpg.pool.PoolConnectionProxy | AsyncConnection | AsyncSession"

Fetch = Callable[..., Awaitable[Sequence[Mapping[str, Any]]]]


def caller_fetch(connection: CallerConnection) -> Fetch:
    """A ``fetch(sql, *args)`` that runs inside the caller's transaction."""
    if isinstance(connection, asyncpg.Connection | asyncpg.pool.PoolConnectionProxy):
        return cast(Fetch, connection.fetch)
    if isinstance(connection, AsyncSession | AsyncConnection):
        sqlalchemy_connection = connection

        async def fetch(sql: str, *args: Any) -> Sequence[Mapping[str, Any]]:
            if isinstance(sqlalchemy_connection, AsyncSession):
                target = await sqlalchemy_connection.connection()
            else:
                target = sqlalchemy_connection
            result = await target.exec_driver_sql(sql, args)
            return cast(Sequence[Mapping[str, Any]], result.mappings().all())

        return fetch
    raise TypeError(
        "connection must be an asyncpg connection or a SQLAlchemy AsyncConnection or "
        f"AsyncSession, got {type(connection).__name__}"
    )


async def insert_jobs(
    fetch: Fetch, specs: Sequence[JobSpec]
) -> list[tuple[Job, bool]]:
    """Insert ``specs``; each comes back with its job and whether it was inserted
    (``False``: a live job with its dedup_key was returned instead)."""
    with_keys = any(spec.dedup_key is not None for spec in specs)
    if len(specs) == 1:
        if not with_keys:
            [row] = await fetch(queries.INSERT_JOB, *specs[0].as_row())
            return [(inserted_job(row, specs[0]), True)]
        rows = list(await fetch(queries.INSERT_JOB_DEDUP, *specs[0].as_row()))
        return await _match_inserted(fetch, specs, rows)
    columns = batch_columns(specs)
    if with_keys:
        rows = sorted(await fetch(queries.INSERT_JOBS_DEDUP, *columns), key=lambda row: row["id"])  # insertion order
        return await _match_inserted(fetch, specs, rows)
    [inserted] = await fetch(queries.INSERT_JOBS, *columns)
    now = inserted["now"]  # created_at, and run_at where none was given
    jobs = []
    for job_id, queue, max_retries, timeout, spec in zip(
            inserted["ids"], inserted["queues"] or (), inserted["max_retries"] or (), inserted["timeouts"] or (),
            specs, strict=True):
        run_at = now if spec.run_at is None else spec.run_at.astimezone(UTC)
        jobs.append((new_job(spec, job_id, now, run_at, queue, max_retries, timeout), True))
    return jobs


async def _match_inserted(
    fetch: Fetch, specs: Sequence[JobSpec], inserted: Sequence[Mapping[str, Any]]
) -> list[tuple[Job, bool]]:
    """Pair each spec with its job: the inserted one, or the live job its dedup_key hit."""
    results: list[tuple[Job, bool] | None] = [None] * len(specs)
    by_key = {row["dedup_key"]: row for row in inserted if row["dedup_key"] is not None}
    plain = iter(row for row in inserted if row["dedup_key"] is None)
    missing: list[int] = []
    seen_keys: dict[str, Job] = {}
    for index, spec in enumerate(specs):
        if spec.dedup_key is None:
            results[index] = (inserted_job(next(plain), spec), True)
        elif spec.dedup_key in seen_keys:  # a duplicate within this batch
            results[index] = (seen_keys[spec.dedup_key], False)
        elif spec.dedup_key in by_key:  # the first spec of a key inserted it
            job = inserted_job(by_key[spec.dedup_key], spec)
            seen_keys[spec.dedup_key] = job
            results[index] = (job, True)
        else:
            missing.append(index)
    if missing:
        keys = list({specs[i].dedup_key for i in missing})
        rows = await fetch(queries.SELECT_ALIVE_BY_DEDUP_KEYS, keys)
        alive = {row["dedup_key"]: row_to_job(row) for row in rows}
        retry: list[int] = []
        for index in missing:
            existing = alive.get(specs[index].dedup_key)
            if existing is None:
                retry.append(index)  # the blocking job finished in between: insert again
            else:
                results[index] = (existing, False)
        if retry:
            again = await insert_jobs(fetch, [specs[i] for i in retry])
            for index, result in zip(retry, again, strict=True):
                results[index] = result
    return [result for result in results if result is not None]
