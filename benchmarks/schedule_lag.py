"""Schedule lag: N `Schedule.every(seconds=1)` (or `cron("* * * * *")`) no-op pipelines
on one `agora-pg worker` process (or several, each registering all N: every tick runs once).

    python -m benchmarks.schedule_lag [--pipelines 200] [--seconds 30] [--schedule every1s|cron]
        [--processes 1] [--database-url URL] [--breakdown]

Lag is how late a run starts: agora.runs.started_at - agora.runs.scheduled_for,
over every run except each pipeline's first (whose due time is the registration) and
the runs of ticks due while the processes were starting: before the last process's
pipeline worker had registered in agora.workers. Those are counted apart ("start-up runs"): a tick that falls
into a start-up of 2,000 pipelines waits for it (0.5-0.7 s on this machine).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import signal
import subprocess
import sys

import asyncpg

from agora_pg.settings import Settings, load_settings
from benchmarks.drain import ROOT, scratch_database, worker_environment


# The runs counted (every pipeline's but the first $1) with their lag; of them, the
# measured ones are the runs of ticks due once every process had started (the last
# agora.workers row of a pipeline worker), the others are start-up runs.
MEASURED_RUNS = """
WITH all_started AS (
    SELECT coalesce(max(started_at), '-infinity') AS at FROM agora.workers WHERE 'agora:pipelines' = ANY(queues)
), counted AS (
    SELECT worker_id, scheduled_for, started_at, extract(epoch FROM started_at - scheduled_for) * 1000 AS lag_ms,
           scheduled_for <= (SELECT at FROM all_started) AS during_startup
    FROM (
        SELECT *, row_number() OVER (PARTITION BY pipeline_id ORDER BY scheduled_for) AS n
        FROM agora.runs WHERE pipeline_id IS NOT NULL AND status = 'succeeded'
    ) AS numbered
    WHERE n > $1
), measured AS (SELECT * FROM counted WHERE NOT during_startup)
"""

# The measured runs' lag and the start-up runs' count and longest lag, in one pass.
LAG = MEASURED_RUNS + """
SELECT count(*) FILTER (WHERE NOT during_startup) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_ms) FILTER (WHERE NOT during_startup) AS p50,
       percentile_cont(0.99) WITHIN GROUP (ORDER BY lag_ms) FILTER (WHERE NOT during_startup) AS p99,
       max(lag_ms) FILTER (WHERE NOT during_startup) AS max,
       count(*) FILTER (WHERE during_startup) AS startup_runs,
       max(lag_ms) FILTER (WHERE during_startup) AS startup_max
FROM counted
"""

# Each tick's lag by process.
LAG_BY_TICK = MEASURED_RUNS + """
SELECT to_char(scheduled_for, 'HH24:MI:SS') AS tick, worker_id, count(*) AS runs,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY lag_ms) AS p50, max(lag_ms) AS max,
       min(lag_ms) AS min, extract(epoch FROM max(started_at) - min(started_at)) * 1000 AS spread
FROM measured
GROUP BY scheduled_for, worker_id ORDER BY scheduled_for, worker_id
"""

PROCESSES = (
    "SELECT id, to_char(started_at, 'HH24:MI:SS.MS') AS registered, queues "
    "FROM agora.workers ORDER BY started_at"
)


@dataclasses.dataclass
class Breakdown:
    """What ``--breakdown`` prints: rows of ``LAG_BY_TICK`` and of ``PROCESSES``."""

    ticks: list[asyncpg.Record] = dataclasses.field(default_factory=list)
    processes: list[asyncpg.Record] = dataclasses.field(default_factory=list)


async def measure(
    settings: Settings, pipelines: int, seconds: float, schedule: str = "every1s", processes: int = 1,
    breakdown: Breakdown | None = None,
) -> dict[str, float]:
    """Run the pipelines for ``seconds`` on ``processes`` worker processes; lag percentiles in ms
    of the measured runs, and the number and longest lag of the start-up runs (and, into
    ``breakdown`` if given, each measured tick's lag by process and the processes' rows)."""
    first_measured = 0 if schedule == "cron" else 1  # a cron schedule's first run is a real tick
    async with scratch_database(settings) as (database, store):
        env = worker_environment(
            AGORA_PG_DATABASE_URL=database.url, AGORA_PG_LOG_LEVEL="WARNING",
            BENCH_PIPELINES=str(pipelines), BENCH_SCHEDULE=schedule,
        )
        started = [
            subprocess.Popen(
                [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "benchmarks.schedule_worker"],
                cwd=ROOT, env=env,
            )
            for _ in range(processes)
        ]
        try:
            await asyncio.sleep(seconds)
        finally:
            for process in started:
                process.send_signal(signal.SIGTERM)
            for process in started:
                process.wait(timeout=60)
        async with store.connection() as connection:
            row = await connection.fetchrow(LAG, first_measured)
            if breakdown is not None:
                breakdown.ticks = await connection.fetch(LAG_BY_TICK, first_measured)
                breakdown.processes = await connection.fetch(PROCESSES)
        return {key: float(row[key] or 0) for key in ("runs", "p50", "p99", "max", "startup_runs", "startup_max")}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipelines", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=30)
    parser.add_argument("--schedule", choices=("every1s", "cron"), default="every1s")
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--database-url")
    parser.add_argument("--breakdown", action="store_true",
                        help="also print each tick's runs by process (for cron; every1s prints a row a second)")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    print("| pipelines | schedule | processes | seconds | runs measured | lag p50 ms | lag p99 ms | lag max ms |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|")
    breakdown = Breakdown() if args.breakdown else None
    lag = await measure(settings, args.pipelines, args.seconds, args.schedule, args.processes, breakdown)
    print(f"| {args.pipelines} | {args.schedule} | {args.processes} | {args.seconds:.0f} | {lag['runs']:.0f} "
          f"| {lag['p50']:.1f} | {lag['p99']:.1f} | {lag['max']:.1f} |")
    if lag["startup_runs"]:
        print(f"\nstart-up runs (due before the last process had started), not measured: "
              f"{lag['startup_runs']:.0f}, lag max {lag['startup_max']:.1f} ms")
    if breakdown is not None:
        print("\n| tick | process | runs | lag min ms | lag p50 ms | lag max ms | first to last start ms |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for tick in breakdown.ticks:
            print(f"| {tick['tick']} | {tick['worker_id']} | {tick['runs']} | {tick['min']:.1f} "
                  f"| {tick['p50']:.1f} | {tick['max']:.1f} | {tick['spread']:.1f} |")
        print("\n| process (agora.workers) | registered | queues |\n|---|---|---|")
        for process in breakdown.processes:
            print(f"| {process['id']} | {process['registered']} | {','.join(process['queues'])} |")


if __name__ == "__main__":
    asyncio.run(main())
