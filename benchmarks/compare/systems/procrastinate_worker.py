"""Procrastinate 3.10 worker process for the comparison harness, and the App both sides use.

``python -m benchmarks.compare.systems.procrastinate_worker --mode drain|latency`` reads the
database URL from ``BENCH_DATABASE_URL`` and runs ``App.run_worker_async`` (LISTEN/NOTIFY on,
default 5 s polling) with ``BENCH_PROCRASTINATE_CONCURRENCY`` sub-workers and a psycopg pool of
concurrency + 1 connections, as Procrastinate's "Mind the size of your PostgreSQL pool" advises
for short jobs. SIGTERM/SIGINT cancel the worker task (graceful stop), exit status 0.
"""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":
    # A stop signal during the slow imports below exits 0; ``run`` then handles them itself.
    for _stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(_stop_signal, lambda *_: sys.exit(0))

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
from typing import Any

import asyncpg
from procrastinate import App, PsycopgConnector
from procrastinate.tasks import Task

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import record_latency

DEFAULT_CONCURRENCY = 10
_latency_connection: asyncpg.Connection | None = None


def concurrency() -> int:
    return int(os.environ.get("BENCH_PROCRASTINATE_CONCURRENCY", str(DEFAULT_CONCURRENCY)))


async def noop(**kwargs: Any) -> None:
    """The drain job: does nothing."""


async def latency(**kwargs: Any) -> None:
    """The latency job: records enqueue-to-start time on the worker's own connection."""
    assert _latency_connection is not None, "latency jobs run only in a --mode latency worker"
    await record_latency(_latency_connection, kwargs)


@dataclasses.dataclass(frozen=True)
class BenchApp:
    app: App
    noop: Task[Any, Any, Any]
    latency: Task[Any, Any, Any]


def make_app(url: str, pool_size: int) -> BenchApp:
    """An App (not yet opened) on ``url`` with the "noop" and "latency" tasks."""
    connector = PsycopgConnector(conninfo=Database(url).asyncpg_url, min_size=1, max_size=pool_size)
    app = App(connector=connector)
    return BenchApp(app, app.task(name="noop")(noop), app.task(name="latency")(latency))


async def run(mode: str) -> None:
    """Run the worker until SIGTERM/SIGINT, then cancel it (``install_signal_handlers=False`` is
    the documented option for handling signals yourself; a cancelled worker stops gracefully:
    it finishes running jobs, then unregisters). A signal during start-up takes effect once
    the App is open, so the pool is never cancelled half-opened."""
    global _latency_connection
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(stop_signal, stop.set)
    url = os.environ["BENCH_DATABASE_URL"]
    workers = concurrency()
    bench = make_app(url, pool_size=workers + 1)
    if mode == "latency":
        _latency_connection = await asyncpg.connect(Database(url).asyncpg_url)
    try:
        async with bench.app.open_async():
            worker = asyncio.create_task(bench.app.run_worker_async(
                concurrency=workers, wait=True, name=f"bench-{mode}", install_signal_handlers=False))
            stopped = asyncio.create_task(stop.wait())
            await asyncio.wait([worker, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            worker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await worker
    finally:
        if _latency_connection is not None:
            await _latency_connection.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=["drain", "latency"], required=True)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    asyncio.run(run(args.mode))
    for stop_signal in (signal.SIGTERM, signal.SIGINT):  # stopped: ignore repeats while exiting
        signal.signal(stop_signal, signal.SIG_IGN)


if __name__ == "__main__":
    # Run from the module imported under its real name, so the App and its tasks are not
    # defined in __main__ (Procrastinate warns against a top-level App in __main__).
    from benchmarks.compare.systems.procrastinate_worker import main as imported_main

    imported_main()
