"""Worker processes and scratch databases for the comparison harness."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg

from agora_pg.db.connect import Database
from benchmarks.compare.systems.base import CREATE_LATENCY_TABLE, System
from benchmarks.drain import database_named, worker_environment

ROOT = Path(__file__).resolve().parents[2]


@contextlib.asynccontextmanager
async def fresh_database(server: Database, system: System, label: str) -> AsyncIterator[str]:
    """A new database with the system's schema and the latency table; dropped afterwards."""
    name = f"bench_{system.key}_{label}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(server.asyncpg_url)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
        url = database_named(server, name).url
        try:
            connection = await asyncpg.connect(url)
            try:
                await connection.execute(CREATE_LATENCY_TABLE)
            finally:
                await connection.close()
            await system.setup(url)
            yield url
        finally:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await admin.close()


@contextlib.contextmanager
def workers(system: System, url: str, mode: str, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``count`` worker processes of ``system``; stopped with SIGTERM (then SIGKILL) on exit."""
    env = worker_environment(BENCH_DATABASE_URL=url, PYTHONUNBUFFERED="1", **system.worker_env(url))
    started = [
        subprocess.Popen(system.worker_command(url, mode), cwd=ROOT, env=env, start_new_session=True)  # type: ignore[arg-type]
        for _ in range(count)
    ]
    try:
        yield started
    finally:
        for process in started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGTERM)
        for process in started:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.kill(process.pid, signal.SIGKILL)
                process.wait(timeout=10)
