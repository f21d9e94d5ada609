"""A claim's cost with many jobs waiting for later (issue 16, item 4).

    python -m benchmarks.claim_future [--future 100000] [--due 10] [--claims 300] [--database-url URL]

In a scratch database: --future priority-1 jobs due tomorrow and --due priority-0 jobs
due now. A claim of --due jobs is run --claims times (each in a transaction rolled
back, so every claim sees the same rows) in two layouts of the same rows:

- delayed: as agora-pg stores them, the future jobs marked delayed and so outside
  jobs_claimable_idx;
- in the claim index: the same jobs with delayed = false, as every job was stored
  before migration 0006 (the claim then walks the future rows of the higher priority).

Prints the median and p95 claim time and the index buffers one claim reads; then
the future jobs are made due and promoted as a worker's promotion step does, timed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from datetime import UTC, datetime, timedelta
from typing import Any

from agora_pg.db import queries
from agora_pg.job_spec import JobSpec
from agora_pg.settings import load_settings
from agora_pg.worker.worker import PROMOTE_BATCH
from benchmarks.drain import scratch_database


def _index_scan(node: dict[str, Any]) -> dict[str, Any] | None:
    if node.get("Index Name") == "jobs_claimable_idx":
        return node
    return next((found for child in node.get("Plans", []) if (found := _index_scan(child))), None)


async def _measure(connection: Any, due: int, claims: int) -> dict[str, float]:
    await connection.execute("VACUUM ANALYZE agora.jobs")
    timings = []
    for _ in range(claims):
        transaction = connection.transaction()
        await transaction.start()
        started = time.perf_counter()
        rows = await connection.fetch(queries.CLAIM_JOBS, "default", due, "bench", 30.0, True, 2)
        timings.append(time.perf_counter() - started)
        await transaction.rollback()
        assert len(rows) == due, len(rows)
    transaction = connection.transaction()
    await transaction.start()
    [[plan]] = await connection.fetch(
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {queries.CLAIM_JOBS}", "default", due, "bench", 30.0, True, 2
    )
    await transaction.rollback()
    scan = _index_scan(json.loads(plan)[0]["Plan"])
    assert scan is not None
    timings.sort()
    return {
        "median_ms": statistics.median(timings) * 1000,
        "p95_ms": timings[int(len(timings) * 0.95)] * 1000,
        "index_buffers": scan["Shared Hit Blocks"] + scan["Shared Read Blocks"],
    }


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--future", type=int, default=100_000)
    parser.add_argument("--due", type=int, default=10)
    parser.add_argument("--claims", type=int, default=300)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    async with scratch_database(settings) as (_database, store):
        tomorrow = datetime.now(UTC) + timedelta(days=1)
        for start in range(0, args.future, 5000):
            count = min(5000, args.future - start)
            await store.jobs.enqueue([JobSpec("later", priority=1, run_at=tomorrow) for _ in range(count)])
        await store.jobs.enqueue([JobSpec("now") for _ in range(args.due)])
        async with store.connection() as connection:
            delayed = await _measure(connection, args.due, args.claims)
            await connection.execute("UPDATE agora.jobs SET delayed = false")
            indexed = await _measure(connection, args.due, args.claims)
            await connection.execute(
                "UPDATE agora.jobs SET delayed = true, run_at = now() - interval '1 second' WHERE kind = 'later'"
            )
            await connection.execute("VACUUM ANALYZE agora.jobs")
        started = time.perf_counter()
        promoted = 0
        while (promotion := await store.jobs.promote_due(PROMOTE_BATCH)).promoted:
            promoted += promotion.promoted
        promote_seconds = time.perf_counter() - started
    print(f"claim of {args.due} due jobs beside {args.future:,} higher-priority jobs due tomorrow "
          f"({args.claims} claims each):")
    for name, figures in (("delayed (agora-pg now)", delayed), ("in the claim index (before)", indexed)):
        print(f"  {name:30} median {figures['median_ms']:7.3f} ms   p95 {figures['p95_ms']:7.3f} ms   "
              f"index buffers per claim {figures['index_buffers']:,}")
    print(f"promoting {promoted:,} delayed jobs once due, {PROMOTE_BATCH:,} per statement: "
          f"{promote_seconds:.2f} s ({promoted / promote_seconds:,.0f} jobs/s)")


if __name__ == "__main__":
    asyncio.run(main())
