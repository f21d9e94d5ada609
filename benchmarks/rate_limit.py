"""Rate limit over a long run: N starts per window per key, across several worker processes.

    python -m benchmarks.rate_limit [--rate 100 --window 60] [--minutes 5] [--processes 3] [--keys 3]
                                    [--database-url URL]

Creates a scratch database (as ``benchmarks.drain``), enqueues more no-op jobs per key
than the run can start, starts ``--processes`` ``agora-pg worker`` processes whose kind
is limited to ``--rate`` starts in any ``--window`` seconds per payload key, lets them
run for ``--minutes``, then reads every attempt's start from ``agora.runs`` (the
database's clock). It prints, per key, the most starts in any window (the limit must
hold: at most ``--rate``) and the starts in each whole window from the first start
(the limit must also be reached: ``--rate`` each, within 1).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
from collections import defaultdict
from datetime import datetime

from agora_pg.db.connect import resolve_database
from agora_pg.job_spec import JobSpec
from agora_pg.settings import load_settings
from benchmarks.drain import ROOT, scratch_database, worker_environment


def most_in_any_window(starts: list[datetime], window: float) -> int:
    """The most starts inside any half-open interval of ``window`` seconds."""
    times = sorted(start.timestamp() for start in starts)
    most, first = 0, 0
    for last, moment in enumerate(times):
        while moment - times[first] >= window:
            first += 1
        most = max(most, last - first + 1)
    return most


def per_window(starts: list[datetime], origin: datetime, window: float, windows: int) -> list[int]:
    """Starts in each of the ``windows`` whole windows from ``origin``."""
    counts = [0] * windows
    for start in starts:
        index = int((start - origin).total_seconds() // window)
        if 0 <= index < windows:
            counts[index] += 1
    return counts


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=int, default=100)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--processes", type=int, default=3)
    parser.add_argument("--keys", type=int, default=3)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    run_seconds = args.minutes * 60
    windows = int(run_seconds // args.window)
    per_key = int(args.rate * (windows + 2))
    async with resolve_database(settings) as server, \
            scratch_database(settings.replace(database_url=server.url)) as (database, store):
        for key in range(args.keys):
            await store.jobs.enqueue([JobSpec("noop", {"key": f"k{key}"}) for _ in range(per_key)])
        env = worker_environment(AGORA_PG_DATABASE_URL=database.url, AGORA_PG_LOG_LEVEL="WARNING",
                                 BENCH_RATE=f"{args.rate}/{args.window}")
        workers = [subprocess.Popen([sys.executable, "-m", "agora_pg.cli", "worker", "--module",
                                     "benchmarks.noop_worker", "--concurrency", "20"], cwd=ROOT, env=env)
                   for _ in range(args.processes)]
        try:
            await asyncio.sleep(run_seconds + 2)
        finally:
            for worker in workers:
                worker.send_signal(signal.SIGTERM)
            for worker in workers:
                worker.wait(timeout=60)
        async with store.connection() as connection:
            rows = await connection.fetch(
                "SELECT j.payload->>'key' AS key, r.started_at FROM agora.runs AS r "
                "JOIN agora.jobs AS j ON j.id = r.job_id")
            workers_seen = await connection.fetchval("SELECT count(DISTINCT worker_id) FROM agora.runs")
    starts: dict[str, list[datetime]] = defaultdict(list)
    for row in rows:
        starts[row["key"]].append(row["started_at"])
    origin = min(row["started_at"] for row in rows)
    print(f"{args.rate} starts per {args.window:g} s per key, {args.keys} keys, {args.processes} worker processes "
          f"({workers_seen} of them started jobs), {args.minutes:g} min")
    print(f"| key | starts | most in any {args.window:g} s | starts in each whole window from the first start |")
    print("|---|---:|---:|---|")
    for key in sorted(starts):
        counts = per_window(starts[key], origin, args.window, windows)
        print(f"| {key} | {len(starts[key])} | {most_in_any_window(starts[key], args.window)} "
              f"| {', '.join(map(str, counts))} |")


if __name__ == "__main__":
    asyncio.run(main())
