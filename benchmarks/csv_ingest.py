"""CSV into PostgreSQL: a pipeline (CsvSource -> DatabaseSink, checkpoints on) against
``psql \\copy`` of the same file, on the same server.

    python -m benchmarks.csv_ingest [--rows 1000000] [--batch-size 10000] [--database-url URL]
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from agora_pg.db.pipeline_state import PipelineState
from agora_pg.pipelines import CsvSource, DatabaseSink, Pipeline
from agora_pg.pipelines.pipeline import PipelineRun, current_run
from agora_pg.settings import load_settings
from benchmarks.drain import scratch_database

TABLE = "CREATE TABLE public.{name} (id bigint PRIMARY KEY, amount numeric(12, 2), note text, at timestamptz)"
SCHEMA = {"id": "int", "amount": "decimal", "at": "datetime"}


def write_csv(path: Path, rows: int) -> None:
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(("id", "amount", "note", "at"))
        for i in range(1, rows + 1):
            writer.writerow((i, f"{i % 100000}.{i % 100:02d}", f"event number {i}", "2026-11-30T08:00:00+00:00"))


def psql_binary() -> str:
    found = shutil.which("psql") or next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin/psql"))), None)
    if found is None:
        raise SystemExit("csv_ingest: psql not found")
    return str(found)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=10_000)
    parser.add_argument("--database-url")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "events.csv"
        write_csv(path, args.rows)
        size_mb = path.stat().st_size / 1e6
        async with scratch_database(settings) as (database, store):
            async with store.connection() as connection:
                await connection.execute(TABLE.format(name="events"))
                await connection.execute(TABLE.format(name="events_copy"))
            built = Pipeline(CsvSource(path, SCHEMA), id="csv_ingest", batch_size=args.batch_size).build(
                DatabaseSink(database.url, "public.events"))
            token = current_run.set(PipelineRun(store))
            started = time.perf_counter()
            try:
                report = await built.run()
            finally:
                current_run.reset(token)
                await built.close()
            pipeline_seconds = time.perf_counter() - started
            checkpoint = await PipelineState(store).checkpoint("csv_ingest")

            psql_url = database.url.replace("postgresql+asyncpg://", "postgresql://")
            started = time.perf_counter()
            subprocess.run([psql_binary(), psql_url, "-v", "ON_ERROR_STOP=1", "-q", "-c",
                            f"\\copy public.events_copy FROM '{path}' WITH (FORMAT csv, HEADER true)"], check=True)
            psql_seconds = time.perf_counter() - started
            async with store.connection() as connection:
                counts = [await connection.fetchval(f"SELECT count(*) FROM public.{name}") for name in ("events", "events_copy")]
    print(f"{args.rows:,} rows, {size_mb:.0f} MB of CSV, batches of {args.batch_size:,}, {os.cpu_count()} cores")
    print(f"pipeline CsvSource -> DatabaseSink (COPY, checkpoint per batch): {args.rows / pipeline_seconds:,.0f} rows/s "
          f"({pipeline_seconds:.1f} s; {report.read:,} read, {counts[0]:,} in the table, checkpoint at {checkpoint.position if checkpoint else None:,})")
    print(f"psql \\copy of the same file:                                        {args.rows / psql_seconds:,.0f} rows/s "
          f"({psql_seconds:.1f} s; {counts[1]:,} in the table)")
    print(f"pipeline / psql: {psql_seconds / pipeline_seconds:.2f}")


if __name__ == "__main__":
    asyncio.run(main())
