"""Run every chaos scenario and write the report's table.

    python -m tests.chaos.report [--size full|short] [--only NAME ...]
                                 [--database-url URL] [--output docs/reliability/README.md]

Each scenario gets a new, migrated database on the server (``--database-url``,
``AGORA_PG_DATABASE_URL``, or the embedded server), dropped afterwards; the
PostgreSQL restart scenarios start a private server of their own. Every process a
scenario starts is killed at the end. The table is printed and, with ``--output``,
written into that file between the report markers.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from agora_pg.db import migrate
from agora_pg.db.connect import Database, resolve_database
from agora_pg.db.store import Store
from agora_pg.settings import load_settings

from .harness import FULL, SHORT, Result, table
from .scenarios import SCENARIOS, ScenarioSkipped, Setup

BEGIN, END = "<!-- chaos report: begin -->", "<!-- chaos report: end -->"


async def run_one(server_url: str, name: str, size_name: str, workdir: Path) -> Result:
    admin = await asyncpg.connect(server_url)
    database = f"agora_chaos_{uuid.uuid4().hex[:8]}"
    await admin.execute(f'CREATE DATABASE "{database}"')
    url = urlunsplit(urlsplit(server_url)._replace(path=f"/{database}"))
    started: list[subprocess.Popen[bytes]] = []
    try:
        store = Store.open(Database(url), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()
        size = FULL if size_name == "full" else SHORT
        return await SCENARIOS[name](Setup(url, workdir, started.append), size)
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(10)
        await admin.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
        await admin.close()


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", choices=("full", "short"), default="full")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="these scenarios only")
    parser.add_argument("--database-url")
    parser.add_argument("--output", type=Path, help="a Markdown file to write the table into")
    parser.add_argument("--merge", action="store_true",
                        help="keep the other scenarios' rows already in --output (a rerun of some of them)")
    args = parser.parse_args()
    settings = load_settings(os.environ)
    if args.database_url:
        settings = settings.replace(database_url=args.database_url)
    results: list[Result] = []
    started = time.monotonic()
    async with resolve_database(settings) as server:
        admin = await asyncpg.connect(server.asyncpg_url)
        version = await admin.fetchval("SHOW server_version")
        await admin.close()
        for name in args.only or list(SCENARIOS):
            print(f"running {name} ({args.size}) ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix=f"chaos-{name}-") as workdir:
                try:
                    result = await run_one(server.asyncpg_url, name, args.size, Path(workdir))
                except ScenarioSkipped as reason:
                    print(f"skipped {name}: {reason}", file=sys.stderr, flush=True)
                    continue
            results.append(result)
            print(table([result]).splitlines()[-1], file=sys.stderr, flush=True)
    failing = {r.scenario: r.violations() for r in results if r.violations()}
    heading = (
        f"Run of {time.strftime('%Y-%m-%d', time.gmtime())}: `python -m tests.chaos.report --size {args.size}`, "
        f"PostgreSQL {version} (the restart scenarios on a private embedded server), Python "
        f"{platform.python_version()}, {os.cpu_count()} cores; {time.monotonic() - started:.0f} s in all. "
        + ("Every scenario met its thresholds." if not failing else f"Thresholds missed: {failing}.")
    )
    report = f"{heading}\n\n{table(results)}\n"
    print(report)
    if args.output is not None:
        text = args.output.read_text(encoding="utf-8") if args.output.exists() else f"{BEGIN}\n{END}\n"
        before, _, rest = text.partition(BEGIN)
        previous, _, after = rest.partition(END)
        if args.merge:
            report = merged(previous, results, heading)
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(f"{before}{BEGIN}\n{report}{END}{after}", encoding="utf-8")
    return 1 if failing else 0


def merged(previous: str, results: list[Result], heading: str) -> str:
    """The previous report with these scenarios' rows replaced or added, and this run's
    heading added below the previous one."""
    lines = previous.strip().splitlines()
    rows = [line for line in lines if line.startswith("| ") and not line.startswith("| scenario")]
    headings = [line for line in lines if line and not line.startswith("|")]
    new_rows = table(results).splitlines()[2:]
    names = {r.scenario for r in results}
    kept = [row for row in rows if row.split("|")[1].strip() not in names]
    head = table([]).splitlines()
    rerun = f"Then {', '.join(sorted(names))} again. " + heading
    return "\n\n".join(["\n".join(headings + [rerun]), "\n".join(head + kept + new_rows)]) + "\n"


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
