"""Side-by-side benchmark of agora-pg, PgQueuer, Procrastinate and the raw-SQL limit.

    pip install -e '.[embedded,bench]'
    python -m benchmarks.compare [--database-url URL] [--systems agora,pgqueuer,procrastinate]

Every system runs the same workloads on the same server in one run, each in a
fresh database. Results go to benchmarks/results/<time>/ (results.json,
results.md, drain.png) and the table is printed. Without --database-url (or
AGORA_PG_DATABASE_URL / DATABASE_URL) the embedded PostgreSQL is used.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg

from agora_pg.db.connect import Database, resolve_database
from agora_pg.settings import load_settings
from benchmarks.compare import raw, report, server_work, workloads
from benchmarks.compare.processes import ROOT
from benchmarks.compare.systems.agora import LOW_CONCURRENCY, AgoraSystem
from benchmarks.compare.systems.base import System

SYSTEMS = {
    "agora": "benchmarks.compare.systems.agora:AgoraSystem",
    "pgqueuer": "benchmarks.compare.systems.pgqueuer_system:PgQueuerSystem",
    "procrastinate": "benchmarks.compare.systems.procrastinate_system:ProcrastinateSystem",
}
WORKLOADS = ("enqueue", "drain", "work", "latency", "schedules", "grown", "raw")
SERVER_SETTINGS = ("server_version", "synchronous_commit", "fsync", "shared_buffers", "max_connections",
                   "wal_level", "work_mem", "max_wal_size")


def load_system(key: str) -> System:
    module, _, name = SYSTEMS[key].partition(":")
    return getattr(importlib.import_module(module), name)()  # type: ignore[no-any-return]


async def server_facts(server: Database) -> dict[str, Any]:
    connection = await asyncpg.connect(server.asyncpg_url)
    try:
        facts = {name: await connection.fetchval(f"SHOW {name}") for name in SERVER_SETTINGS}
    finally:
        await connection.close()
    facts.update(cores=os.cpu_count(), machine=platform.platform(), python=platform.python_version(),
                 server=server.display_url, date=datetime.now(UTC).isoformat(timespec="seconds"))
    return facts


async def age_runs(url: str) -> None:
    """Move the last drain's runs out of the window the agora adapter measures (the
    last hour): they become history for the next round."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            "UPDATE agora.runs SET started_at = started_at - interval '1 day', finished_at = finished_at - interval '1 day' "
            "WHERE finished_at > now() - interval '1 hour'"
        )
    finally:
        await connection.close()


async def grow_history(url: str, rows: int) -> None:
    """Preload ``rows`` finished jobs, a day old, each with its run (agora-pg's schema)."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            """
            INSERT INTO agora.jobs (name, kind, status, payload, max_retries, attempt,
                                    created_at, run_at, started_at, finished_at)
            SELECT 'history', 'noop', 'done', '{}', 3, 1, t, t, t, t
            FROM generate_series(1, $1) AS i, LATERAL (SELECT now() - interval '1 day' AS t) AS day
            """,
            rows,
        )
        await connection.execute(
            """
            INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status)
            SELECT id, 1, 'history', started_at, finished_at, 'succeeded' FROM agora.jobs WHERE name = 'history'
            """
        )
        await connection.execute("VACUUM ANALYZE agora.jobs")
        await connection.execute("VACUUM ANALYZE agora.runs")
        # Flush the bulk load now, so its checkpoint I/O does not land in the measured drain.
        await connection.execute("CHECKPOINT")
    finally:
        await connection.close()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    chosen = [key.strip() for key in args.systems.split(",") if key.strip()]
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    results: dict[str, Any] = {"systems": {}, "errors": [], "drain_jobs": args.jobs, "processes": args.processes,
                               "drain_repeats": args.drain_repeats,
                               "history": args.history if "grown" not in skip else 0}
    async with resolve_database(settings) as server:
        results["server"] = await server_facts(server)
        print(f"server: {json.dumps(results['server'])}", flush=True)
        for key in chosen:
            system = load_system(key)
            entry: dict[str, Any] = {"name": system.name, "describe": system.describe()}
            results["systems"][key] = entry

            async def attempt(label: str, coroutine: Any, entry: dict[str, Any] = entry,
                              system: System = system) -> Any:
                started = time.monotonic()
                try:
                    value = await coroutine
                    print(f"{system.name}: {label}: {value} ({time.monotonic() - started:.0f}s)", flush=True)
                    return value
                except Exception as error:  # one failing workload must not end the run
                    results["errors"].append(f"{system.name}, {label}: {type(error).__name__}: {error}")
                    traceback.print_exc()
                    return None

            if "enqueue" not in skip:
                rates = await attempt("enqueue", workloads.enqueue_rates(server, system, args.enqueue_jobs))
                entry.update(rates or {})
            if "drain" not in skip:
                drain_jobs = args.procrastinate_jobs if key == "procrastinate" and args.procrastinate_jobs else args.jobs
                if drain_jobs != args.jobs:
                    entry["describe"] += f"; drains of {drain_jobs:,} jobs (it drains a few hundred a second)"
                for processes in args.processes:
                    entry[f"drain_{processes}p"] = await attempt(
                        f"drain {processes}p", workloads.drain_rate_repeated(server, system, drain_jobs, processes,
                                                                             args.drain_repeats))
            if "work" not in skip:
                work_jobs = args.work_jobs
                if key == "procrastinate" and args.procrastinate_jobs:
                    work_jobs = min(work_jobs, args.procrastinate_jobs)
                entry["work"] = await attempt(
                    "server work per job", server_work.server_work_per_job(server, system, work_jobs))
                if key == "agora":
                    entry["work_low_concurrency"] = await attempt(
                        f"server work per job at --concurrency {LOW_CONCURRENCY}",
                        server_work.server_work_per_job(server, AgoraSystem(LOW_CONCURRENCY), work_jobs))
            if "latency" not in skip:
                latency = await attempt("latency", workloads.wakeup_latency(server, system, args.latency_jobs))
                entry.update({f"wakeup_{k}": v for k, v in (latency or {}).items()})
            if key == "agora" and "schedules" not in skip:
                from benchmarks.schedule_lag import measure

                server_settings = settings.replace(database_url=server.url)
                every = await attempt("schedules every(1s)", measure(server_settings, 200, args.every_seconds))
                cron = await attempt("schedules cron", measure(server_settings, 1000, args.cron_seconds, "cron"))
                entry.update({f"lag_every_{k}": v for k, v in (every or {}).items()})
                entry.update({f"lag_cron_{k}": v for k, v in (cron or {}).items()})
            if key == "agora" and "grown" not in skip:
                entry["drain_empty_1p_median"] = await attempt(
                    "drain on the empty table, median of 3",
                    workloads.drain_rate_median(server, system, args.jobs, 3, "empty", age_runs=age_runs))
                entry["drain_grown_1p"] = await attempt(
                    "drain with grown history, median of 3",
                    workloads.drain_rate_median(server, system, args.jobs, 3, "grown",
                                                prepare=lambda url: grow_history(url, args.history), age_runs=age_runs))
        if "raw" not in skip:
            started = time.monotonic()
            try:
                results["raw"] = await raw.raw_limits(server, seconds=args.raw_seconds)
                print(f"raw: {results['raw']} ({time.monotonic() - started:.0f}s)", flush=True)
            except Exception as error:
                results["errors"].append(f"raw: {type(error).__name__}: {error}")
                traceback.print_exc()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--systems", default="agora,pgqueuer,procrastinate")
    parser.add_argument("--skip", default="", help=f"comma-separated workloads to skip: {', '.join(WORKLOADS)}")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain [20000]")
    parser.add_argument("--procrastinate-jobs", type=int,
                        help="jobs per drain (and at most per server-work drain) for Procrastinate, whose drains "
                             "are 50-70x slower [--jobs]")
    parser.add_argument("--enqueue-jobs", type=int, default=10_000)
    parser.add_argument("--drain-repeats", type=int, default=1,
                        help="drains per process count, each in a fresh database; the median is reported [1]")
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--work-jobs", type=int, default=100_000, help="jobs of the server-work drain [100000]")
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--history", type=int, default=5_000_000, help="finished jobs preloaded for workload 5")
    parser.add_argument("--every-seconds", type=float, default=30)
    parser.add_argument("--cron-seconds", type=float, default=150)
    parser.add_argument("--raw-seconds", type=int, default=8)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--no-chart", action="store_true")
    args = parser.parse_args()
    results = asyncio.run(run(args))
    folder = args.out / datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(results, indent=2, default=str))
    table = report.markdown(results)
    (folder / "results.md").write_text(table)
    print(table)
    if not args.no_chart:
        drawn = report.chart(results, folder / "drain.png")
        print(f"chart: {folder / 'drain.png'}" if drawn else "chart skipped: matplotlib is not installed")
    print(f"results in {folder}")


if __name__ == "__main__":
    main()
