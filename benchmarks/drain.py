"""Drain benchmark: N pre-enqueued no-op jobs, one `agora-pg worker` process.

    python -m benchmarks.drain [--jobs 10000] [--concurrency 10 100 500] [--database-url URL]
                               [--limit-per-key N --keys K] [--queue-limit N]

Creates a scratch database on the server (AGORA_PG_DATABASE_URL / DATABASE_URL
or --database-url; the embedded server in .agora-pg otherwise), migrates it,
enqueues the jobs in batches, starts one worker process per concurrency
setting and waits until every job is done. The rate is jobs divided by the
time from the first to the last completion recorded in agora.runs. The
database is dropped at the end. With ``--limit-per-key N``, the jobs' kind is limited
to N running jobs per payload key, the jobs spread over ``--keys`` keys: the cost of
the limited claim. With ``--queue-limit N``, the jobs' queue is limited to N running
jobs (the cost of a limited queue's claim, when N is never reached). Limits are declared
before the jobs are enqueued, as a running fleet has them: each job is keyed as it is
inserted (declared after, they key every waiting job in one update, whose 100,000 dead
row versions the claims then step over on a server without autovacuum).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psutil

from agora_pg.db import migrate
from agora_pg.db.connect import Database, resolve_database
from agora_pg.db.store import Store
from agora_pg.job_spec import JobSpec
from agora_pg.limits import KindLimit, QueueLimit
from agora_pg.settings import Settings, load_settings

ROOT = Path(__file__).resolve().parent.parent
UNFINISHED_LEFT = (  # each part reads one partial index (the first one in its order)
    "SELECT (SELECT id FROM agora.jobs WHERE (status = 'pending' OR (status = 'failed' "
    "AND retry_count < max_retries)) AND NOT delayed ORDER BY queue, kind, priority DESC, run_at, id LIMIT 1) IS NOT NULL "
    "OR EXISTS (SELECT 1 FROM agora.jobs WHERE delayed) "
    "OR EXISTS (SELECT 1 FROM agora.jobs WHERE status = 'processing')"
)


def worker_environment(**extra: str) -> dict[str, str]:
    """This process's environment without agora-pg settings (a worker gets exactly the
    ones the benchmark gives it), plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(extra)
    return env


def database_named(server: Database, name: str) -> Database:
    parts = urlsplit(server.asyncpg_url)
    return Database(urlunsplit(parts._replace(path=f"/{name}")))


async def enqueue(store: Store, jobs: int, keys: int = 0) -> float:
    """Enqueue ``jobs`` no-op jobs (with ``keys``, each with a payload key of that many)."""
    started = time.perf_counter()
    for offset in range(0, jobs, 5000):
        await store.jobs.enqueue([JobSpec("noop", {"i": i, "key": f"k{i % keys}"} if keys else {"i": i})
                                  for i in range(offset, min(jobs, offset + 5000))])
    return time.perf_counter() - started


@contextlib.asynccontextmanager
async def scratch_database(settings: Settings) -> AsyncIterator[tuple[Database, Store]]:
    """A new, migrated database on the configured server; dropped afterwards."""
    async with resolve_database(settings) as server:
        name = f"agora_bench_{uuid.uuid4().hex[:8]}"
        admin = await asyncpg.connect(server.asyncpg_url)
        await admin.execute(f'CREATE DATABASE "{name}"')
        database = database_named(server, name)
        store = Store.open(database)
        try:
            await migrate.upgrade(store)
            yield database, store
        finally:
            await store.close()
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()


async def drain_once(settings: Settings, jobs: int, concurrency: int, limit_per_key: int = 0,
                     keys: int = 0, queue_limit: int = 0) -> dict[str, float]:
    async with scratch_database(settings) as (database, store):
        if limit_per_key:  # (the worker declares the same: benchmarks.noop_worker)
            await store.jobs.declare_limits({"noop": KindLimit(concurrency=limit_per_key, limit_by="key")})
        if queue_limit:
            await store.jobs.declare_queue_limits({"default": QueueLimit(concurrency=queue_limit)})
        enqueue_seconds = await enqueue(store, jobs, keys if limit_per_key else 0)
        env = worker_environment(AGORA_PG_DATABASE_URL=database.url, AGORA_PG_LOG_LEVEL="WARNING")
        if limit_per_key:
            env["BENCH_LIMIT_PER_KEY"] = str(limit_per_key)
        if queue_limit:
            env["BENCH_QUEUE_LIMIT"] = str(queue_limit)
        started = time.perf_counter()
        process = subprocess.Popen(
            [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "benchmarks.noop_worker",
             "--concurrency", str(concurrency)],
            cwd=ROOT, env=env,
        )
        time_limit = max(600.0, jobs / 1000)
        peak_rss = 0
        watched = psutil.Process(process.pid)
        try:
            async with store.connection() as connection:
                # (cheap: both partial indexes hold only the jobs not yet done; a count of the
                # done jobs every 50 ms took most of a core at a million jobs)
                while await connection.fetchval(UNFINISHED_LEFT):
                    with contextlib.suppress(psutil.Error):
                        peak_rss = max(peak_rss, watched.memory_info().rss)
                    if process.poll() is not None:
                        raise RuntimeError(f"worker exited with {process.returncode}")
                    if time.perf_counter() - started > time_limit:
                        raise RuntimeError(f"drain did not finish within {time_limit:.0f} s")
                    await asyncio.sleep(0.05)
                wall = time.perf_counter() - started
                done = await connection.fetchval("SELECT count(*) FROM agora.jobs WHERE status = 'done'")
                if done != jobs:
                    raise RuntimeError(f"{done:,} of {jobs:,} jobs done (the others failed)")
                span = await connection.fetchval(
                    "SELECT extract(epoch FROM max(finished_at) - min(finished_at)) FROM agora.runs"
                )
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=60)
        return {"enqueue_per_s": jobs / enqueue_seconds, "drain_per_s": jobs / float(span), "wall_s": wall,
                "peak_rss_mb": peak_rss / 2**20}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--database-url")
    parser.add_argument("--limit-per-key", type=int, default=0,
                        help="limit the kind to N running jobs per payload key [no limit]")
    parser.add_argument("--keys", type=int, default=50, help="keys the jobs spread over, with --limit-per-key [50]")
    parser.add_argument("--queue-limit", type=int, default=0,
                        help="limit the jobs' queue to N running jobs [no limit]")
    parser.add_argument("--repeats", type=int, default=1, help="drains per concurrency; prints each and the median")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    async with resolve_database(settings) as server:
        admin = await asyncpg.connect(server.asyncpg_url)
        version = await admin.fetchval("SHOW server_version")
        sync_commit = await admin.fetchval("SHOW synchronous_commit")
        await admin.close()
        print(f"PostgreSQL {version} (synchronous_commit={sync_commit}) at {server.display_url}; {os.cpu_count()} cores")
        if args.limit_per_key:
            print(f"the kind limited to {args.limit_per_key} running per key, over {args.keys} keys")
        if args.queue_limit:
            print(f"the queue limited to {args.queue_limit} running jobs")
        print("| jobs | concurrency | drain jobs/s (first to last completion) | wall s (incl. start-up) "
              "| batch enqueue jobs/s | worker peak RSS MB |")
        print("|---:|---:|---:|---:|---:|---:|")
        for concurrency in args.concurrency:
            rates = []
            for _ in range(args.repeats):
                result = await drain_once(settings.replace(database_url=server.url), args.jobs, concurrency,
                                          args.limit_per_key, args.keys, args.queue_limit)
                rates.append(result["drain_per_s"])
                print(
                    f"| {args.jobs} | {concurrency} | {result['drain_per_s']:,.0f} | {result['wall_s']:.2f} "
                    f"| {result['enqueue_per_s']:,.0f} | {result['peak_rss_mb']:.0f} |",
                    flush=True,
                )
            if args.repeats > 1:
                print(f"| median of {args.repeats} | {concurrency} | {statistics.median(rates):,.0f} | | | |",
                      flush=True)


if __name__ == "__main__":
    asyncio.run(main())
