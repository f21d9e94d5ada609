"""A PgQueuer worker process: ``pgqueuer.run(factory, batch_size=...)``, the code path of
``pgq run`` (whose CLI fails to start with the installed typer), on uvloop as ``pgq run`` does.

``--mode drain`` registers a no-op "noop" entrypoint; ``--mode latency`` registers "latency",
which records enqueue-to-start latency on its own asyncpg connection. The URL comes from
``BENCH_DATABASE_URL``, the batch size from ``BENCH_PGQUEUER_BATCH``. SIGTERM/SIGINT stop the
worker gracefully (``pgqueuer.run`` handles them) and the process exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import logging
import os
from collections.abc import AsyncIterator

import asyncpg
import pgqueuer
from pgqueuer import Job, PgQueuer

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import record_latency
from benchmarks.compare.systems.pgqueuer_system import BATCH_SIZE


@contextlib.asynccontextmanager
async def create_pgqueuer(mode: str) -> AsyncIterator[PgQueuer]:
    url = Database(os.environ["BENCH_DATABASE_URL"]).asyncpg_url
    async with contextlib.AsyncExitStack() as stack:
        connection = await asyncpg.connect(url)
        stack.push_async_callback(connection.close)
        pgq = PgQueuer.from_asyncpg_connection(connection)
        if mode == "drain":

            @pgq.entrypoint("noop")
            async def noop(job: Job) -> None:
                pass

        else:
            recorder = await asyncpg.connect(url)
            stack.push_async_callback(recorder.close)

            @pgq.entrypoint("latency")
            async def latency(job: Job) -> None:
                await record_latency(recorder, json.loads(job.payload or b"{}"))

        yield pgq


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mode", choices=("drain", "latency"), required=True)
    mode = parser.parse_args().mode
    logging.basicConfig(level=logging.WARNING)
    run = pgqueuer.run(functools.partial(create_pgqueuer, mode), batch_size=BATCH_SIZE)
    try:
        import uvloop
    except ImportError:
        asyncio.run(run)
    else:
        uvloop.run(run)


if __name__ == "__main__":
    main()
