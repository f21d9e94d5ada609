"""The heartbeat's cost: W workers each renewing the leases of J running jobs.

    python -m benchmarks.heartbeat_cost [--workers 100] [--jobs-per-worker 500] [--rounds 5]
        [--lease-seconds 30] [--database-url URL]

A scratch database gets W worker rows, each with a live worker lease, and W x J jobs in
``processing``, each claimed under its worker's lease (no lease of its own, as a claim
leaves it). One round is what the lease supervisors of all W workers send in one renewal
interval (``lease_seconds / RENEWALS_PER_LEASE``): W ``RENEW_LEASES`` statements (the statement of
``store.workers.renew_leases``), each naming its worker's J ``(id, attempt)`` tokens,
over 10 connections. Measured per round: the CPU time of the server processes that ran
the statements (from ``/proc/<backend pid>/stat``, so the server must run on this host),
the WAL written (``pg_current_wal_lsn``), and how many job rows were updated (and how many
of those updates were HOT). The
share is that CPU time over the renewal interval, for one core and for all of them.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time

import asyncpg

from agora_pg.db import queries
from agora_pg.runtime.leases import RENEWALS_PER_LEASE
from agora_pg.settings import load_settings
from benchmarks.drain import scratch_database

CONNECTIONS = 10
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of one process, from /proc."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime (fields 14, 15)


async def _table_updates(connection: asyncpg.Connection) -> tuple[int, int]:
    row = await connection.fetchrow(
        "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = 'agora.jobs'::regclass"
    )
    return int(row["n_tup_upd"]), int(row["n_tup_hot_upd"])


async def measure(database_url: str, workers: int, jobs_per_worker: int, rounds: int, lease_seconds: float) -> None:
    settings = load_settings(os.environ).replace(database_url=database_url)
    async with scratch_database(settings) as (database, store):
        async with store.connection() as connection:
            await connection.execute(
                "INSERT INTO agora.workers (id, hostname, pid, queues, lease_expires_at) "
                "SELECT 'w' || n, 'bench', n, '{default}', now() + interval '30 seconds' "
                "FROM generate_series(1, $1::int) AS n",
                workers,
            )
            await connection.execute(
                """
                INSERT INTO agora.jobs (name, kind, status, locked_by, attempt, started_at)
                SELECT 'bench', 'noop', 'processing', 'w' || (1 + n % $1::int), 1, now()
                FROM generate_series(0, $1::int * $2::int - 1) AS n
                """,
                workers, jobs_per_worker,
            )
            await connection.execute("VACUUM ANALYZE agora.jobs")
            held = await connection.fetch("SELECT locked_by, id, attempt FROM agora.jobs ORDER BY id")
        tokens: dict[str, list[tuple[int, int]]] = {}
        for row in held:
            tokens.setdefault(row["locked_by"], []).append((row["id"], row["attempt"]))

        connections = [await asyncpg.connect(database.asyncpg_url) for _ in range(CONNECTIONS)]
        try:
            backends = [await connection.fetchval("SELECT pg_backend_pid()") for connection in connections]
            probe = connections[0]
            print(f"PostgreSQL {await probe.fetchval('SHOW server_version')}; {os.cpu_count()} cores; "
                  f"{workers} workers x {jobs_per_worker} running jobs; renewal every {lease_seconds / RENEWALS_PER_LEASE:g} s")
            print("| round | wall ms | server CPU ms | WAL KB | job updates | HOT | share of 1 core | share of all cores |")
            print("|---:|---:|---:|---:|---:|---:|---:|---:|")
            queue: asyncio.Queue[str] = asyncio.Queue()
            for number in range(1, rounds + 1):
                for worker_id in tokens:
                    queue.put_nowait(worker_id)
                cpu_before = sum(_cpu_seconds(pid) for pid in backends)
                wal_before = await probe.fetchval("SELECT pg_current_wal_lsn()")
                updates_before = await _table_updates(probe)
                started = time.perf_counter()

                async def renew_from(connection: asyncpg.Connection) -> None:
                    while not queue.empty():
                        worker_id = queue.get_nowait()
                        held_by = tokens[worker_id]
                        row = await connection.fetchrow(
                            queries.RENEW_LEASES, worker_id, lease_seconds,
                            [token[0] for token in held_by], [token[1] for token in held_by], [], [],
                        )
                        if row["lost_job_ids"] or row["unknown_job_ids"] or not row["worker_renewed"]:
                            raise RuntimeError(f"{worker_id}'s renewal went wrong: {dict(row)}")

                await asyncio.gather(*(renew_from(connection) for connection in connections))
                wall = time.perf_counter() - started
                cpu = sum(_cpu_seconds(pid) for pid in backends) - cpu_before
                wal = await probe.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)", wal_before)
                await asyncio.sleep(1.2)  # (backends flush table statistics at most once a second)
                updates_after = await _table_updates(probe)
                updated = updates_after[0] - updates_before[0]
                hot = updates_after[1] - updates_before[1]
                interval = lease_seconds / RENEWALS_PER_LEASE
                print(f"| {number} | {wall * 1000:.0f} | {cpu * 1000:.0f} | {float(wal) / 1024:,.0f} | {updated:,} "
                      f"| {hot:,} | {cpu / interval:.1%} | {cpu / interval / (os.cpu_count() or 1):.1%} |",
                      flush=True)
        finally:
            for connection in connections:
                await connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=100)
    parser.add_argument("--jobs-per-worker", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lease-seconds", type=float, default=30.0)
    parser.add_argument("--database-url", default=os.environ.get("AGORA_PG_DATABASE_URL"))
    args = parser.parse_args()
    if not args.database_url:
        parser.error("--database-url is needed: the server must run on this host (its CPU is read from /proc)")
    asyncio.run(measure(args.database_url, args.workers, args.jobs_per_worker, args.rounds, args.lease_seconds))


if __name__ == "__main__":
    main()
