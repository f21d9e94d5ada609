"""The ``agora-pg`` command line: the edge where asyncio.run lives."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Coroutine, Sequence
from typing import Any
from pathlib import Path

from agora_pg.db import migrate as migrations
from agora_pg.db.connect import resolve_database
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, ConfigError
from agora_pg.loading import load_worker
from agora_pg.runner import WorkerPool
from agora_pg.worker import Worker
from agora_pg.settings import load_settings, parse_queues

log = logging.getLogger("agora_pg")

EXIT_ERROR = 1
EXIT_USAGE = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="agora-pg", description="Durable Postgres job queue.")
    parser.add_argument("--log-level", default=os.environ.get("AGORA_PG_LOG_LEVEL", "INFO"))
    commands = parser.add_subparsers(dest="command", required=True)

    commands.add_parser("migrate", help="apply the database migrations (idempotent)")

    worker = commands.add_parser("worker", help="run a worker module's get_worker()")
    worker.add_argument("--module", default="worker", help="dotted module path [worker]")
    worker.add_argument("--queues", help="comma-separated queues (overrides WORKER_QUEUES)")
    worker.add_argument("--concurrency", type=int, help="jobs run at once (overrides WORKER_CONCURRENCY)")
    worker.add_argument("--health-port", type=int, help="serve /health and /ready on this port (0: any free port)")
    return parser


async def run_migrate() -> None:
    settings = load_settings(os.environ)
    async with resolve_database(settings) as database:
        store = Store.open(database, pool_size=1)
        try:
            await migrations.upgrade(store)
            versions = await store.schema_versions()
        finally:
            await store.close()
    log.info("database %s is at revision %s", database.display_url, ", ".join(sorted(versions)))


async def run_worker(module: str, queues: str | None, concurrency: int | None, health_port: int | None) -> None:
    loaded = load_worker(module, Path.cwd())
    if concurrency is not None and concurrency < 1:
        raise ConfigError("--concurrency", f"must be >= 1, got {concurrency}")
    if health_port is not None and not 0 <= health_port <= 65535:
        raise ConfigError("--health-port", f"must be a port number, got {health_port}")
    if isinstance(loaded, Worker):
        pool = WorkerPool(graceful_shutdown_timeout=loaded.effective_settings().shutdown_timeout).register(loaded)
    else:
        pool = loaded
    if pool.job_worker is not None:
        pool.job_worker.configure(
            queues=parse_queues(queues, key="--queues") if queues is not None else None,
            concurrency=concurrency,
        )
    elif queues is not None or concurrency is not None:
        raise ConfigError("--queues/--concurrency", f"{module}.get_worker() registered no job Worker")
    if health_port is not None:
        pool.health_port = health_port
    await pool.run()


def run_event_loop(main_coroutine: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed (the ``fast`` extra): the worker's hot path is
    socket I/O and task switching, which uvloop does in C. Plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main_coroutine)
    else:
        uvloop.run(main_coroutine)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        if args.command == "migrate":
            asyncio.run(run_migrate())
        elif args.command == "worker":
            run_event_loop(run_worker(args.module, args.queues, args.concurrency, args.health_port))
    except ConfigError as error:
        print(f"agora-pg: {error}", file=sys.stderr)
        return EXIT_USAGE
    except AgoraError as error:
        print(f"agora-pg: {error}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
