"""A worker process keeps working across a PostgreSQL restart.

Runs on a PostgreSQL server of its own (the embedded one: faults.PrivateServer), so
the machine's server is never restarted.
"""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store

from ..conftest import Processes
from ..faults import PrivateServer
from .test_worker_processes import eventually, scalar, start_worker, status_is, stop
from .worker_app import CREATE_EXECUTIONS

pytestmark = pytest.mark.acceptance


async def enqueue_record(url: str) -> int:
    connection = await asyncpg.connect(url)
    try:
        return int(await connection.fetchval("INSERT INTO agora.jobs (name, kind) VALUES ('r', 'record') RETURNING id"))
    finally:
        await connection.close()


async def test_worker_survives_a_postgres_restart(processes: Processes) -> None:
    server = PrivateServer()
    try:
        url = server.url()
        store = Store.open(Database(url), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()
        await scalar(url, CREATE_EXECUTIONS)
        worker = start_worker(processes, url)

        before = await enqueue_record(url)
        await eventually(lambda: status_is(url, before, "done"), 30, "a job before the restart")
        started_at = await scalar(url, "SELECT pg_postmaster_start_time()")

        await asyncio.to_thread(server.pg_ctl, "-w", "-m", "fast", "restart")

        assert await scalar(url, "SELECT pg_postmaster_start_time()") != started_at
        after = await enqueue_record(url)
        await eventually(lambda: status_is(url, after, "done"), 30, "a job after the restart")
        code, output = stop(worker)
        assert code == 0, output
        assert "Traceback" not in output, output
    finally:
        server.cleanup()
