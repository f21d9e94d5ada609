"""Table sizes before and after pruning, and the drain rate while pruning (issue 15).

    python -m benchmarks.prune_size [--jobs 1000000] [--drain-jobs 200000] [--repeats 3]
        [--concurrency 500] [--batch-size 1000] [--partition-rows N] [--partition-days 40]
        [--keep-days 30] [--database-url URL] [--skip sizes,drain,partition]

Every part runs in a scratch database of its own on the server (see benchmarks.drain,
whose helpers this reuses), dropped at the end; workers are real `agora-pg worker`
processes running no-op jobs, with their own pruning off (AGORA_PG_PRUNE_AFTER=off), so
only the benchmark's explicit Store.prune() deletes anything.

1. sizes: enqueue --jobs no-op jobs, drain them with one worker; sizes of agora.jobs and
   agora.runs (heap, indexes, total, live/dead rows, each index), then after a VACUUM
   (what autovacuum would leave), after Store.prune() of all of them, after VACUUM
   (ANALYZE), and after VACUUM FULL.
2. drain: --jobs finished jobs (with their runs) inserted directly as history, then
   --drain-jobs new jobs drained (a) alone (followed by the same prune alone) and (b)
   while Store.prune() deletes the history; --repeats rounds, medians.
3. partition: the same history over --partition-days days; the delete-based prune of
   the rows older than --keep-days versus dropping the daily partitions of a copy of
   agora.runs partitioned by RANGE (finished_at), plus the jobs rows that still have
   to be deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import io
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from datetime import datetime, timedelta
from typing import Any

import asyncpg

from agora_pg.db import queries
from agora_pg.db.connect import Database, resolve_database
from agora_pg.db.store import Store
from agora_pg.retention import PruneReport, Retention
from agora_pg.settings import Settings, load_settings
from benchmarks.drain import ROOT, enqueue, scratch_database, worker_environment

TABLES = ("agora.jobs", "agora.runs")
MIB = 1024 * 1024
STARTED_WORKERS: list[subprocess.Popen[bytes]] = []

# -- statements (values always as parameters; identifiers are this file's constants) ----

SERVER_FACTS = """
SELECT current_setting('server_version') AS version, current_setting('autovacuum') AS autovacuum,
       current_setting('synchronous_commit') AS synchronous_commit,
       current_setting('shared_buffers') AS shared_buffers,
       current_setting('maintenance_work_mem') AS maintenance_work_mem,
       current_setting('max_wal_size') AS max_wal_size
"""

TABLE_SIZE = """
SELECT pg_relation_size(c.oid) AS heap, pg_indexes_size(c.oid) AS indexes,
       pg_total_relation_size(c.oid) AS total, s.n_live_tup AS live, s.n_dead_tup AS dead
FROM pg_class AS c JOIN pg_stat_user_tables AS s ON s.relid = c.oid
WHERE c.oid = $1::regclass
"""

EXACT_TUPLES = "SELECT tuple_count, dead_tuple_count, free_space FROM pgstattuple($1::regclass)"

INDEX_SIZES = """
SELECT c.relname AS name, pg_relation_size(c.oid) AS size
FROM pg_index AS i JOIN pg_class AS c ON c.oid = i.indexrelid
WHERE i.indrelid = $1::regclass
ORDER BY c.relname
"""

# A partitioned table's own sizes are 0: add up its partitions (with their indexes).
PARTITIONED_SIZE = """
SELECT count(*) AS partitions, coalesce(sum(pg_relation_size(i.inhrelid)), 0) AS heap,
       coalesce(sum(pg_indexes_size(i.inhrelid)), 0) AS indexes,
       coalesce(sum(pg_total_relation_size(i.inhrelid)), 0) AS total
FROM pg_inherits AS i WHERE i.inhparent = $1::regclass
"""

# Finished jobs inserted directly, $1 of them, finishing evenly from $2 over $3, each
# with the run a worker would have recorded. Same payload shape as the enqueued jobs.
INSERT_HISTORY_JOBS = """
INSERT INTO agora.jobs (name, kind, status, payload, attempt, created_at, run_at, started_at, finished_at)
SELECT 'noop', 'noop', 'done', jsonb_build_object('i', g.i), 1, t.at, t.at, t.at, t.at
FROM generate_series(1, $1::int) AS g(i),
     LATERAL (SELECT $2::timestamptz + $3::interval * ((g.i - 1)::float8 / $1::int)) AS t(at)
"""
INSERT_HISTORY_RUNS = """
INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status)
SELECT id, 1, 'history', started_at, finished_at, 'succeeded' FROM agora.jobs WHERE id > $1 ORDER BY id
"""

MAX_JOB_ID = "SELECT coalesce(max(id), 0) FROM agora.jobs"
MAX_RUN_ID = "SELECT coalesce(max(id), 0) FROM agora.runs"
COUNT_RUNS_AFTER = "SELECT count(*) FROM agora.runs WHERE id > $1"
COUNT_DONE_AFTER = "SELECT count(*) FROM agora.jobs WHERE id > $1 AND status = 'done'"
COUNT_JOBS_UP_TO = "SELECT count(*) FROM agora.jobs WHERE id <= $1"
DRAIN_SPAN = """
SELECT count(*) AS runs, extract(epoch FROM max(finished_at) - min(finished_at)) AS span
FROM agora.runs WHERE id > $1
"""
DATABASE_NOW = "SELECT now()"
START_OF_DAY = "SELECT date_trunc('day', now())"

# -- partitioning (part 3) ------------------------------------------------------

PART_SCHEMA = "part_bench"
CREATE_PART_SCHEMA = "CREATE SCHEMA part_bench"
# Unpartitioned copies: LIKE ... INCLUDING ALL takes columns, defaults, identity, CHECKs
# and indexes, but no foreign key and no trigger.
CREATE_FLAT_RUNS = "CREATE TABLE part_bench.runs_flat (LIKE agora.runs INCLUDING ALL)"
CREATE_JOBS_COPY = "CREATE TABLE part_bench.jobs (LIKE agora.jobs INCLUDING ALL)"
CREATE_JOBS_ALONE = "CREATE TABLE part_bench.jobs_alone (LIKE agora.jobs INCLUDING ALL)"
# agora.runs partitioned by the time a run ended. Every unique index has to include the
# partition key, so none of them enforces what agora.runs' ones do; a primary key would
# also make finished_at NOT NULL (a running pipeline run has none).
CREATE_PART_RUNS = [
    """CREATE TABLE part_bench.runs (LIKE agora.runs INCLUDING DEFAULTS INCLUDING CONSTRAINTS)
       PARTITION BY RANGE (finished_at)""",
    "CREATE UNIQUE INDEX runs_id_finished_idx ON part_bench.runs (id, finished_at)",
    """CREATE UNIQUE INDEX runs_job_attempt_idx ON part_bench.runs (job_id, attempt, finished_at)
       WHERE job_id IS NOT NULL""",
    "CREATE INDEX runs_finished_at_idx ON part_bench.runs (finished_at)",
    "CREATE UNIQUE INDEX runs_pipeline_tick_idx ON part_bench.runs (pipeline_id, scheduled_for, finished_at)",
    "CREATE INDEX runs_pipeline_started_idx ON part_bench.runs (started_at) WHERE pipeline_id IS NOT NULL",
    """ALTER TABLE part_bench.runs ADD CONSTRAINT runs_job_id_fkey
       FOREIGN KEY (job_id) REFERENCES part_bench.jobs (id) ON DELETE CASCADE""",
    "CREATE TABLE part_bench.runs_default PARTITION OF part_bench.runs DEFAULT",
]
# Partition DDL takes no parameters: this function builds it on the server, quoting the
# bounds itself (format %L), so the client only ever passes values as parameters.
CREATE_PARTITION_FUNCTION = """
CREATE FUNCTION part_bench.add_daily_partitions(parent regclass, first_day timestamptz, days int)
RETURNS TABLE (partition_name text, lower_bound timestamptz, upper_bound timestamptz)
LANGUAGE plpgsql AS $body$
DECLARE
    day int;
BEGIN
    FOR day IN 0 .. days - 1 LOOP
        lower_bound := first_day + make_interval(days => day);
        upper_bound := lower_bound + interval '1 day';
        partition_name := 'runs_p' || to_char(lower_bound, 'YYYYMMDD');
        EXECUTE format('CREATE TABLE part_bench.%I PARTITION OF %s FOR VALUES FROM (%L) TO (%L)',
                       partition_name, parent, lower_bound, upper_bound);
        RETURN NEXT;
    END LOOP;
END
$body$
"""
ADD_PARTITIONS = "SELECT * FROM part_bench.add_daily_partitions($1::regclass, $2, $3)"
COPY_JOBS = "INSERT INTO part_bench.jobs SELECT * FROM agora.jobs"
COPY_JOBS_ALONE = "INSERT INTO part_bench.jobs_alone SELECT * FROM agora.jobs"
COPY_RUNS_FLAT = "INSERT INTO part_bench.runs_flat SELECT * FROM agora.runs ORDER BY id"
COPY_RUNS_PART = "INSERT INTO part_bench.runs SELECT * FROM agora.runs ORDER BY id"
COUNT_PART_RUNS_BEFORE = "SELECT count(*) FROM part_bench.runs WHERE finished_at < $1"
COUNT_PARTITION = "SELECT count(*) FROM part_bench.runs WHERE finished_at >= $1 AND finished_at < $2"
# The delete-based way on the unpartitioned copy: batches of $2 in finished_at order
# (as PRUNE_PIPELINE_RUNS does), one transaction each.
DELETE_FLAT_RUNS = """
DELETE FROM part_bench.runs_flat WHERE id IN (
    SELECT id FROM part_bench.runs_flat WHERE finished_at < $1 ORDER BY finished_at LIMIT $2
)
"""
# agora-pg's own job-pruning statement, on the copies.
PRUNE_JOBS_COPY = queries.PRUNE_JOBS.replace("agora.jobs", "part_bench.jobs")
PRUNE_JOBS_ALONE = queries.PRUNE_JOBS.replace("agora.jobs", "part_bench.jobs_alone")
EXPLAIN_CASCADE = "EXPLAIN (FORMAT JSON) DELETE FROM part_bench.runs WHERE job_id = $1"


def plan_scans(node: dict[str, Any]) -> list[str]:
    """The scan nodes of an EXPLAIN (FORMAT JSON) plan, as "Index Scan using <index>" etc."""
    found = []
    if "Scan" in node["Node Type"]:
        index = node.get("Index Name")
        found.append(node["Node Type"] + (" (one per partition's index)" if index else ""))
    for child in node.get("Plans", []):
        found.extend(plan_scans(child))
    return found


# -- helpers ----------------------------------------------------------------------------


def mib(size: float) -> str:
    return f"{size / MIB:,.1f}"


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def affected(status: str) -> int:
    return int(status.rsplit(" ", 1)[-1])


async def timed(connection: asyncpg.Connection, statement: str, *args: Any) -> tuple[float, str]:
    started = time.perf_counter()
    status = await connection.execute(statement, *args)
    return time.perf_counter() - started, status


async def snapshot(connection: asyncpg.Connection, label: str, exact: bool) -> dict[str, Any]:
    """Sizes and row counts of agora.jobs and agora.runs now (after ANALYZE), printed."""
    await asyncio.sleep(1.1)  # let other backends' pending statistics reach the shared counters
    for table in TABLES:
        await connection.execute(f"ANALYZE {table}")
    result: dict[str, Any] = {"label": label, "tables": {}, "indexes": {}}
    print(f"\n#### {label}\n")
    print("| table | heap MiB | indexes MiB | toast+other MiB | total MiB | live rows (stats) | dead rows (stats) "
          "| live rows (pgstattuple) | dead rows (pgstattuple) | free space in heap MiB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for table in TABLES:
        row = dict(await connection.fetchrow(TABLE_SIZE, table))
        if exact:
            tuples = await connection.fetchrow(EXACT_TUPLES, table)
            row.update(exact_live=tuples["tuple_count"], exact_dead=tuples["dead_tuple_count"],
                       free=tuples["free_space"])
        result["tables"][table] = row
        for index in await connection.fetch(INDEX_SIZES, table):
            result["indexes"][(table, index["name"])] = index["size"]
        other = row["total"] - row["heap"] - row["indexes"]
        exact_cells = (f"{row['exact_live']:,} | {row['exact_dead']:,} | {mib(row['free'])}" if exact
                       else "n/a | n/a | n/a")
        print(f"| {table} | {mib(row['heap'])} | {mib(row['indexes'])} | {mib(other)} | {mib(row['total'])} "
              f"| {row['live']:,} | {row['dead']:,} | {exact_cells} |")
    sys.stdout.flush()
    return result


def print_index_table(snapshots: list[dict[str, Any]]) -> None:
    print("\nIndex sizes, MiB (pg_relation_size of each index):\n")
    print("| index | " + " | ".join(s["label"] for s in snapshots) + " |")
    print("|---|" + "---:|" * len(snapshots))
    for key in snapshots[0]["indexes"]:
        table, name = key
        cells = " | ".join(mib(s["indexes"].get(key, 0)) for s in snapshots)
        print(f"| {table.split('.')[1]}.{name} | {cells} |")
    sys.stdout.flush()


def start_worker(database: Database, concurrency: int) -> subprocess.Popen[bytes]:
    env = worker_environment(AGORA_PG_DATABASE_URL=database.url, AGORA_PG_LOG_LEVEL="WARNING",
                             AGORA_PG_PRUNE_AFTER="off")
    process = subprocess.Popen(
        [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "benchmarks.noop_worker",
         "--concurrency", str(concurrency)],
        cwd=ROOT, env=env,
    )
    STARTED_WORKERS.append(process)
    return process


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    if process in STARTED_WORKERS:
        STARTED_WORKERS.remove(process)


async def wait_drained(monitor: asyncpg.Connection, process: subprocess.Popen[bytes], base_run_id: int,
                       jobs: int, started: float, timeout: float) -> float:
    """Wait until ``jobs`` runs newer than ``base_run_id`` exist (cheap max(id) polls,
    confirmed by a count); returns the time it was seen."""
    while True:
        top = await monitor.fetchval(MAX_RUN_ID)
        if top - base_run_id >= jobs and await monitor.fetchval(COUNT_RUNS_AFTER, base_run_id) >= jobs:
            return time.perf_counter()
        if process.poll() is not None:
            raise RuntimeError(f"worker exited with {process.returncode}")
        if time.perf_counter() - started > timeout:
            raise RuntimeError(f"drain did not finish within {timeout:.0f} s")
        await asyncio.sleep(0.25)


async def drain_new_jobs(database: Database, monitor: asyncpg.Connection, base_job_id: int, jobs: int,
                         concurrency: int, timeout: float,
                         alongside: asyncio.Task[Any] | None = None) -> dict[str, Any]:
    """Start one worker, wait for the ``jobs`` jobs after ``base_job_id`` to be done,
    stop it. The rate is jobs over the first-to-last completion span (as in drain.py)."""
    base_run_id = await monitor.fetchval(MAX_RUN_ID)
    started = time.perf_counter()
    process = start_worker(database, concurrency)
    result: dict[str, Any] = {}
    try:
        drained_at = await wait_drained(monitor, process, base_run_id, jobs, started, timeout)
        result["alongside_running_at_end"] = alongside is not None and not alongside.done()
        if alongside is not None and not alongside.done():
            result["history_left_at_end"] = await monitor.fetchval(COUNT_JOBS_UP_TO, base_job_id)
    finally:
        stop_worker(process)
    span_row = await monitor.fetchrow(DRAIN_SPAN, base_run_id)
    done = await monitor.fetchval(COUNT_DONE_AFTER, base_job_id)
    if done != jobs:
        raise RuntimeError(f"expected {jobs} new jobs done, found {done}")
    result.update(drain_per_s=jobs / float(span_row["span"]), wall_s=drained_at - started,
                  drained_at=drained_at, span_s=float(span_row["span"]))
    return result


async def timed_prune(store: Store, retention: Retention, batch_size: int) -> tuple[float, float, PruneReport]:
    started = time.perf_counter()
    report = await store.prune(retention, batch_size=batch_size)
    ended = time.perf_counter()
    if report.busy:
        raise RuntimeError("another process was pruning")
    return ended - started, ended, report


async def load_history(connection: asyncpg.Connection, rows: int, first: datetime, span: timedelta) -> float:
    """``rows`` finished jobs with their runs, finishing evenly from ``first`` over ``span``;
    then VACUUM ANALYZE and a CHECKPOINT (so the bulk load's I/O stays out of what follows)."""
    started = time.perf_counter()
    base = await connection.fetchval(MAX_JOB_ID)
    await connection.execute(INSERT_HISTORY_JOBS, rows, first, span)
    await connection.execute(INSERT_HISTORY_RUNS, base)
    for table in TABLES:
        await connection.execute(f"VACUUM (ANALYZE) {table}")
    await connection.execute("CHECKPOINT")
    return time.perf_counter() - started


async def open_monitor(database: Database) -> asyncpg.Connection:
    connection = await asyncpg.connect(database.asyncpg_url)
    try:
        await connection.execute("CREATE EXTENSION IF NOT EXISTS pgstattuple")
    except asyncpg.PostgresError as error:
        print(f"(pgstattuple unavailable: {error}; exact counts skipped)")
    return connection


async def has_pgstattuple(connection: asyncpg.Connection) -> bool:
    return bool(await connection.fetchval("SELECT count(*) FROM pg_extension WHERE extname = $1", "pgstattuple"))


# -- part 1: sizes before and after pruning ------------------------------------------


async def part_sizes(settings: Settings, args: argparse.Namespace) -> None:
    print(f"\n## 1. Sizes after draining {args.jobs:,} jobs, before and after pruning\n", flush=True)
    async with scratch_database(settings) as (database, store):
        monitor = await open_monitor(database)
        try:
            exact = await has_pgstattuple(monitor)
            enqueue_s = await enqueue(store, args.jobs)
            print(f"enqueued {args.jobs:,} jobs in {enqueue_s:.1f} s ({args.jobs / enqueue_s:,.0f} jobs/s)")
            await monitor.execute("CHECKPOINT")
            drain = await drain_new_jobs(database, monitor, 0, args.jobs, args.concurrency, args.timeout)
            print(f"drained with one worker (concurrency {args.concurrency}): {drain['drain_per_s']:,.0f} jobs/s "
                  f"(first to last completion, {drain['span_s']:.1f} s; wall {drain['wall_s']:.1f} s)", flush=True)
            snapshots = [await snapshot(monitor, "after drain (as left)", exact)]
            elapsed, _ = await timed(monitor, "VACUUM (ANALYZE) agora.jobs")
            elapsed_runs, _ = await timed(monitor, "VACUUM (ANALYZE) agora.runs")
            print(f"\nVACUUM (ANALYZE): agora.jobs {elapsed:.1f} s, agora.runs {elapsed_runs:.1f} s "
                  "(what autovacuum would have done; it is off on this server)")
            snapshots.append(await snapshot(monitor, "after drain + VACUUM", exact))

            await asyncio.sleep(2)  # every job finished more than the retention's 1 s ago
            runs_before = await monitor.fetchval("SELECT count(*) FROM agora.runs")
            await monitor.execute("CHECKPOINT")
            retention = Retention(finished=timedelta(seconds=1), failed=timedelta(seconds=1))
            prune_s, _, report = await timed_prune(store, retention, args.batch_size)
            runs_after = await monitor.fetchval("SELECT count(*) FROM agora.runs")
            runs_deleted = runs_before - runs_after
            print(f"\nStore.prune(Retention(1 s, 1 s), batch_size={args.batch_size}): {prune_s:.1f} s; "
                  f"deleted {report.jobs:,} jobs and {runs_deleted:,} runs (by the jobs_delete_runs trigger): "
                  f"{report.jobs / prune_s:,.0f} jobs/s ({report.jobs // args.batch_size + 1:,} batches, "
                  f"{prune_s / (report.jobs / args.batch_size + 1) * 1000:.0f} ms each)", flush=True)
            snapshots.append(await snapshot(monitor, "right after prune", exact))
            vacuum_jobs, _ = await timed(monitor, "VACUUM (ANALYZE) agora.jobs")
            vacuum_runs, _ = await timed(monitor, "VACUUM (ANALYZE) agora.runs")
            print(f"\nVACUUM (ANALYZE) after the prune: agora.jobs {vacuum_jobs:.1f} s, agora.runs {vacuum_runs:.1f} s")
            snapshots.append(await snapshot(monitor, "after prune + VACUUM", exact))
            full_jobs, _ = await timed(monitor, "VACUUM FULL agora.jobs")
            full_runs, _ = await timed(monitor, "VACUUM FULL agora.runs")
            print(f"\nVACUUM FULL (ACCESS EXCLUSIVE lock: claims and completions wait): "
                  f"agora.jobs {full_jobs:.2f} s, agora.runs {full_runs:.2f} s")
            snapshots.append(await snapshot(monitor, "after VACUUM FULL", exact))
            print_index_table(snapshots)
        finally:
            await monitor.close()


# -- part 2: drain rate while pruning -------------------------------------------------


async def drain_round(settings: Settings, args: argparse.Namespace, prune: bool, last: bool) -> dict[str, Any]:
    async with scratch_database(settings) as (database, store):
        monitor = await open_monitor(database)
        try:
            now = await monitor.fetchval(DATABASE_NOW)
            load_s = await load_history(monitor, args.jobs, now - timedelta(days=40), timedelta(days=38))
            base_job_id = await monitor.fetchval(MAX_JOB_ID)
            await enqueue(store, args.drain_jobs)
            await monitor.execute("CHECKPOINT")
            retention = Retention(finished=timedelta(days=1), failed=timedelta(days=1))
            result: dict[str, Any] = {"load_s": load_s}
            if prune:
                task = asyncio.create_task(timed_prune(store, retention, args.batch_size))
                try:
                    drain = await drain_new_jobs(database, monitor, base_job_id, args.drain_jobs,
                                                 args.concurrency, args.timeout, alongside=task)
                finally:
                    prune_s, prune_ended, report = await task
                drain["prune_after_drain_s"] = max(0.0, prune_ended - drain["drained_at"])
            else:
                drain = await drain_new_jobs(database, monitor, base_job_id, args.drain_jobs,
                                             args.concurrency, args.timeout)
                await monitor.execute("CHECKPOINT")
                prune_s, _, report = await timed_prune(store, retention, args.batch_size)  # alone, for comparison
            if report.jobs != args.jobs:
                raise RuntimeError(f"the prune deleted {report.jobs} jobs, expected {args.jobs}")
            result.update(drain, prune_s=prune_s, pruned=report.jobs)
            if last:  # after the timings: the tables' shape once the prune has run (printed later)
                exact = await has_pgstattuple(monitor)
                with contextlib.redirect_stdout(io.StringIO()) as text:
                    shots = [await snapshot(monitor, "after drain + concurrent prune", exact)]
                    for table in TABLES:
                        await monitor.execute(f"VACUUM (ANALYZE) {table}")
                    shots.append(await snapshot(monitor, "then VACUUM", exact))
                    print_index_table(shots)
                result["shape"] = text.getvalue()
            return result
        finally:
            await monitor.close()


async def part_drain(settings: Settings, args: argparse.Namespace) -> None:
    print(f"\n## 2. Drain rate of {args.drain_jobs:,} new jobs with {args.jobs:,} old finished jobs present, "
          f"(a) alone and (b) while Store.prune() deletes the old ones\n", flush=True)
    print("| round | mode | drain jobs/s | drain span s | prune s | prune still running at drain end "
          "| old jobs left at drain end | prune ran on after drain s | history load s |")
    print("|---:|---|---:|---:|---:|---|---:|---:|---:|", flush=True)
    results: dict[str, list[dict[str, Any]]] = {"a": [], "b": []}
    for round_number in range(1, args.repeats + 1):
        order = ("a", "b") if round_number % 2 else ("b", "a")  # alternate, against drift
        for mode in order:
            last = round_number == args.repeats and mode == "b"
            result = await drain_round(settings, args, prune=mode == "b", last=last)
            results[mode].append(result)
            if mode == "a":
                print(f"| {round_number} | a: no pruning (prune alone afterwards) | {result['drain_per_s']:,.0f} "
                      f"| {result['span_s']:.1f} | {result['prune_s']:.1f} (alone) | - | - | - "
                      f"| {result['load_s']:.1f} |", flush=True)
            else:
                left = result.get("history_left_at_end")
                left_cell = "-" if left is None else f"{left:,}"
                print(f"| {round_number} | b: prune running | {result['drain_per_s']:,.0f} | {result['span_s']:.1f} "
                      f"| {result['prune_s']:.1f} | {'yes' if result['alongside_running_at_end'] else 'no'} "
                      f"| {left_cell} | {result['prune_after_drain_s']:.1f} "
                      f"| {result['load_s']:.1f} |", flush=True)
    a_rate = median([r["drain_per_s"] for r in results["a"]])
    b_rate = median([r["drain_per_s"] for r in results["b"]])
    print(f"\nMedian of {args.repeats}: (a) {a_rate:,.0f} jobs/s without pruning; (b) {b_rate:,.0f} jobs/s while "
          f"pruning ({(b_rate / a_rate - 1) * 100:+.1f} %). Prune of {args.jobs:,} jobs: median "
          f"{median([r['prune_s'] for r in results['b']]):.1f} s during the drain (b), "
          f"{median([r['prune_s'] for r in results['a']]):.1f} s alone (a).", flush=True)
    for result in results["b"]:
        if "shape" in result:
            print(f"\n### Shape after the last round with pruning: {args.drain_jobs:,} new jobs done at the end "
                  f"of the tables, {args.jobs:,} old ones pruned from the start")
            print(result["shape"], end="", flush=True)


# -- part 3: partitioning agora.runs by time ------------------------------------------


async def part_partition(settings: Settings, args: argparse.Namespace) -> None:
    rows, days, keep = args.partition_rows, args.partition_days, args.keep_days
    print(f"\n## 3. Partitioning agora.runs by RANGE (finished_at), daily: {rows:,} finished jobs over "
          f"{days} days, keeping {keep} days\n", flush=True)
    async with scratch_database(settings) as (database, store):
        monitor = await open_monitor(database)
        try:
            midnight = await monitor.fetchval(START_OF_DAY)
            first_day = midnight - timedelta(days=days)
            cutoff = midnight - timedelta(days=keep)
            load_s = await load_history(monitor, rows, first_day, timedelta(days=days))
            started = time.perf_counter()
            await monitor.execute(CREATE_PART_SCHEMA)
            for statement in (CREATE_FLAT_RUNS, CREATE_JOBS_COPY, CREATE_JOBS_ALONE, *CREATE_PART_RUNS,
                              CREATE_PARTITION_FUNCTION):
                await monitor.execute(statement)
            partitions = await monitor.fetch(ADD_PARTITIONS, f"{PART_SCHEMA}.runs", first_day, days + 2)
            for statement in (COPY_JOBS, COPY_JOBS_ALONE, COPY_RUNS_FLAT, COPY_RUNS_PART):
                await monitor.execute(statement)
            for table in ("part_bench.jobs", "part_bench.jobs_alone", "part_bench.runs_flat", "part_bench.runs"):
                await monitor.execute(f"VACUUM (ANALYZE) {table}")
            await monitor.execute("CHECKPOINT")
            print(f"loaded agora.jobs/agora.runs in {load_s:.1f} s and the copies in "
                  f"{time.perf_counter() - started:.1f} s: {len(partitions)} daily partitions + default")

            old = [p for p in partitions if p["upper_bound"] <= cutoff]
            old_rows = await monitor.fetchval(COUNT_PART_RUNS_BEFORE, cutoff)
            flat_before = await monitor.fetchrow(TABLE_SIZE, "part_bench.runs_flat")
            part_before = await monitor.fetchrow(PARTITIONED_SIZE, "part_bench.runs")

            # (1) agora-pg today: Store.prune() on agora.jobs, runs by the jobs_delete_runs trigger.
            db_now = await monitor.fetchval(DATABASE_NOW)
            age = db_now - cutoff
            retention = Retention(finished=age, failed=age)
            await monitor.execute("CHECKPOINT")
            prune_s, _, report = await timed_prune(store, retention, args.batch_size)
            # What VACUUM and VACUUM FULL give when the live rows are the newer three quarters.
            exact = await has_pgstattuple(monitor)
            print(f"Store.prune() of the jobs older than {keep} days: {prune_s:.2f} s", flush=True)
            shots = [await snapshot(monitor, f"{keep}-day retention: right after prune", exact)]
            vacuum_times = [(await timed(monitor, f"VACUUM (ANALYZE) {table}"))[0] for table in TABLES]
            shots.append(await snapshot(monitor, f"{keep}-day retention: after VACUUM (ANALYZE)", exact))
            full_times = [(await timed(monitor, f"VACUUM FULL {table}"))[0] for table in TABLES]
            shots.append(await snapshot(monitor, f"{keep}-day retention: after VACUUM FULL", exact))
            print_index_table(shots)
            print(f"\nVACUUM (ANALYZE): agora.jobs {vacuum_times[0]:.2f} s, agora.runs {vacuum_times[1]:.2f} s; "
                  f"VACUUM FULL (ACCESS EXCLUSIVE lock for its whole duration): agora.jobs {full_times[0]:.2f} s, "
                  f"agora.runs {full_times[1]:.2f} s\n", flush=True)

            # (2) runs only, delete-based, unpartitioned copy: batches of batch_size.
            await monitor.execute("CHECKPOINT")
            started = time.perf_counter()
            flat_deleted = 0
            while True:
                deleted = affected(await monitor.execute(DELETE_FLAT_RUNS, cutoff, args.batch_size))
                flat_deleted += deleted
                if deleted < args.batch_size:
                    break
            flat_delete_s = time.perf_counter() - started
            flat_vacuum_s, _ = await timed(monitor, "VACUUM (ANALYZE) part_bench.runs_flat")
            flat_after = await monitor.fetchrow(TABLE_SIZE, "part_bench.runs_flat")

            # (3) runs only, partitioned: DROP TABLE of each partition wholly before the cutoff.
            await monitor.execute("CHECKPOINT")
            drop_times = []
            for partition in old:
                name = queries.quote_identifier(partition["partition_name"])
                elapsed, _ = await timed(monitor, f"DROP TABLE {PART_SCHEMA}.{name}")
                drop_times.append(elapsed)
            drop_s = sum(drop_times)
            part_after = await monitor.fetchrow(PARTITIONED_SIZE, "part_bench.runs")

            # (4) what is left for the partitioned design: the jobs rows, deleted the way
            # agora-pg does (PRUNE_JOBS); ON DELETE CASCADE still probes every remaining partition.
            async def prune_copy(statement: str) -> tuple[float, int]:
                await monitor.execute("CHECKPOINT")
                began = time.perf_counter()
                total = 0
                while True:
                    n = affected(await monitor.execute(statement, age, age, args.batch_size))
                    total += n
                    if n < args.batch_size:
                        return time.perf_counter() - began, total

            jobs_cascade_s, jobs_cascade_n = await prune_copy(PRUNE_JOBS_COPY)
            # How the cascade's DELETE reaches the partitioned runs (planned only, nothing deleted).
            some_job = await monitor.fetchval("SELECT min(job_id) FROM part_bench.runs")
            plan = json.loads(await monitor.fetchval(EXPLAIN_CASCADE, some_job))
            scans = collections.Counter(plan_scans(plan[0]["Plan"]))
            # (5) the same jobs delete with nothing referencing the table: the floor.
            jobs_alone_s, jobs_alone_n = await prune_copy(PRUNE_JOBS_ALONE)

            print(f"\nrows older than {keep} days: {old_rows:,} runs in {len(old)} whole daily partitions "
                  f"(cutoff {cutoff:%Y-%m-%d %H:%M %Z}); Store.prune deleted {report.jobs:,} jobs\n")
            print("| approach | rows | seconds | rows/s |")
            print("|---|---:|---:|---:|")
            print(f"| today: Store.prune() on agora.jobs, runs by the jobs_delete_runs trigger (batches of {args.batch_size}) "
                  f"| {report.jobs:,} jobs + their runs | {prune_s:.2f} | {report.jobs / prune_s:,.0f} |")
            print(f"| runs only: batched DELETE from an unpartitioned copy of agora.runs | {flat_deleted:,} "
                  f"| {flat_delete_s:.2f} | {flat_deleted / flat_delete_s:,.0f} |")
            print(f"|   then VACUUM (ANALYZE) of that copy | | {flat_vacuum_s:.2f} | |")
            print(f"| runs only: DROP TABLE of {len(old)} daily partitions | {old_rows:,} | {drop_s:.3f} "
                  f"(max {max(drop_times, default=0) * 1000:.0f} ms each) | {old_rows / drop_s if drop_s else 0:,.0f} |")
            print(f"| jobs still to delete with partitioned runs: PRUNE_JOBS on a copy of agora.jobs, "
                  f"cascade into the {len(partitions) + 1 - len(old)} remaining partitions | {jobs_cascade_n:,} "
                  f"| {jobs_cascade_s:.2f} | {jobs_cascade_n / jobs_cascade_s:,.0f} |")
            print(f"| jobs delete with nothing referencing jobs (floor) | {jobs_alone_n:,} | {jobs_alone_s:.2f} "
                  f"| {jobs_alone_n / jobs_alone_s:,.0f} |")
            print("\nthe cascade's DELETE FROM part_bench.runs WHERE job_id = $1 is planned as: "
                  + "; ".join(f"{count} x {kind}" for kind, count in scans.most_common()))
            print(f"\npartitioned design in total (drop + jobs delete): {drop_s + jobs_cascade_s:.2f} s versus "
                  f"{prune_s:.2f} s for today's prune ({prune_s / (drop_s + jobs_cascade_s):.2f}x)")
            print(f"partitioned without the foreign key (runs go only with their partition; a deleted job's "
                  f"runs stay until then): {drop_s + jobs_alone_s:.2f} s ({prune_s / (drop_s + jobs_alone_s):.2f}x)")
            print(f"\nsizes of runs: unpartitioned copy {mib(flat_before['total'])} MiB before, "
                  f"{mib(flat_after['total'])} MiB after delete + VACUUM (files not shrunk: "
                  f"space reusable by later inserts); partitioned {mib(part_before['total'])} MiB in "
                  f"{part_before['partitions']} partitions before, {mib(part_after['total'])} MiB in "
                  f"{part_after['partitions']} after the drops (returned to the file system at once)", flush=True)
        finally:
            await monitor.close()


CATCHES = """
Catches of partitioning agora.runs by time (not measured above; they decide as much as the timings):
- a job's runs are deleted with it (ON DELETE CASCADE here, as agora.runs.job_id's foreign key did
  before migration 0011; its jobs_delete_runs trigger since): dropping runs partitions does not
  remove a single jobs row; the jobs still have to be deleted (row by row, as today) and each
  deleted job's cascade probes runs_job_attempt_idx in every remaining partition (job_id is not
  the partition key, so nothing is pruned at plan time). Partitioning agora.jobs as well would need
  an immutable key (created_at), but jobs are pruned by finished_at, which is NULL until a job
  ends and changes on every retry; and the dedup unique index (dedup_key) could not be global.
- A unique index on a partitioned table must contain the partition key: (job_id, attempt) and
  (pipeline_id, scheduled_for) become (job_id, attempt, finished_at) and (pipeline_id,
  scheduled_for, finished_at), which no longer stop a second run of the same attempt or tick
  (CLAIM_PIPELINE_RUNS relies on the latter), and the primary key id becomes (id, finished_at),
  which would forbid a NULL finished_at.
- finished_at is NULL while a pipeline run is running (CLAIM_PIPELINE_RUNS, START_ADHOC_RUN
  insert it so): those rows land in the default partition and move to a daily one (delete +
  insert) when FINISH_PIPELINE_RUN sets finished_at. started_at would be the better key.
- Partitions must be created ahead of time (a maintenance job or pg_partman), and DROP/DETACH
  takes an ACCESS EXCLUSIVE lock on the parent for a moment (waits behind, and blocks, every
  running claim and completion); DETACH ... CONCURRENTLY is refused while a default partition
  exists.
"""


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1_000_000, help="jobs drained and pruned (part 1), old jobs present (part 2)")
    parser.add_argument("--drain-jobs", type=int, default=200_000, help="new jobs drained in part 2")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=500)
    parser.add_argument("--batch-size", type=int, default=1000)
    parser.add_argument("--partition-rows", type=int, help="history rows in part 3 [--jobs]")
    parser.add_argument("--partition-days", type=int, default=40)
    parser.add_argument("--keep-days", type=int, default=30)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds a drain may take")
    parser.add_argument("--skip", default="", help="comma-separated parts to skip: sizes, drain, partition")
    parser.add_argument("--database-url")
    args = parser.parse_args()
    args.partition_rows = args.partition_rows or args.jobs
    skip = {part.strip() for part in args.skip.split(",") if part.strip()}
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    wall_started = time.perf_counter()
    try:
        async with resolve_database(settings) as server:
            admin = await asyncpg.connect(server.asyncpg_url)
            facts = await admin.fetchrow(SERVER_FACTS)
            await admin.close()
            print(f"# agora-pg prune benchmark (issue 15): {' '.join(sys.argv[1:])}\n")
            print(f"PostgreSQL {facts['version']} at {server.display_url}; autovacuum={facts['autovacuum']}, "
                  f"synchronous_commit={facts['synchronous_commit']}, shared_buffers={facts['shared_buffers']}, "
                  f"maintenance_work_mem={facts['maintenance_work_mem']}, max_wal_size={facts['max_wal_size']}; "
                  f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at start", flush=True)
            server_settings = settings.replace(database_url=server.url)
            if "sizes" not in skip:
                await part_sizes(server_settings, args)
            if "drain" not in skip:
                await part_drain(server_settings, args)
            if "partition" not in skip:
                await part_partition(server_settings, args)
                print(CATCHES)
    finally:
        while STARTED_WORKERS:
            stop_worker(STARTED_WORKERS[0])
        print(f"\nTotal wall time: {time.perf_counter() - wall_started:.0f} s "
              f"(load average {os.getloadavg()[0]:.2f} at the end)", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
