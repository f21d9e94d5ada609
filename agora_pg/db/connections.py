"""The Store's own connections: which errors mean "the connection is gone" or "try
again", asyncpg's pool with every call under a deadline, and the LISTEN connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

# (TimeoutError is an OSError: a call past its deadline leaves its connection in an
# unknown state, like a broken one.)
CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    ConnectionError,
)

# Errors the server reports that a retry resolves, by SQLSTATE class: 08 connection
# exception, 40 transaction rollback (deadlock, serialization), 53 insufficient resources
# (too many connections, out of memory or disk), 57 operator intervention (statement
# cancelled, server shutting down, idle session timeout), 58 system error; and 55P03
# lock_not_available (a lock_timeout, e.g. while a migration holds a table).
TRANSIENT_SQLSTATE_CLASSES = frozenset({"08", "40", "53", "57", "58"})
TRANSIENT_SQLSTATES = frozenset({"55P03"})


def is_transient(error: BaseException) -> bool:
    """True for a server error that a retry (on a fresh connection) resolves."""
    if not isinstance(error, asyncpg.PostgresError):
        return False
    sqlstate = str(getattr(error, "sqlstate", "") or "")
    return sqlstate[:2] in TRANSIENT_SQLSTATE_CLASSES or sqlstate in TRANSIENT_SQLSTATES


class CannotConnect(ConnectionError):
    """The server refused a new connection (counted as a connection error)."""


async def _no_reset(_connection: asyncpg.Connection) -> None:
    """Connections go back to the pool without a reset query: agora-pg's statements leave
    no session state, and the default reset costs a round trip per call."""


class ConnectionPool:
    """asyncpg's pool of at most ``max_size`` connections, every call under a deadline.

    A connection that broke, ran past its deadline, or was cancelled mid-call is closed
    rather than reused (its protocol state is unknown); a broken one also retires the
    idle ones, since a server restart kills them all. A query that failed on the
    server leaves its connection usable and it goes back to the pool.
    """

    def __init__(self, url: str, max_size: int, timeout: float) -> None:
        self._url = url
        self._max_size = max_size
        self.timeout = timeout
        self._pool: asyncpg.Pool | None = None
        self._starting = asyncio.Lock()
        self._closed = False

    async def _started(self) -> asyncpg.Pool:
        if self._pool is None:
            async with self._starting:
                if self._pool is None:
                    if self._closed:
                        raise asyncpg.InterfaceError("the pool is closed")
                    self._pool = await asyncpg.create_pool(
                        self._url, min_size=0, max_size=self._max_size, reset=_no_reset,
                        command_timeout=self.timeout, timeout=self.timeout,
                    )
        return self._pool

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        pool = await self._started()
        try:
            connection = await pool.acquire(timeout=self.timeout)
        except asyncpg.PostgresError as error:
            if is_transient(error):
                raise
            raise CannotConnect(str(error)) from error  # refused: no such database, authentication...
        try:
            yield connection
        except CONNECTION_ERRORS:
            _discard(connection)
            await pool.expire_connections()
            raise
        except Exception as error:
            if is_transient(error):  # (a server shutting down also kills the others)
                _discard(connection)
            raise
        except BaseException:
            _discard(connection)  # cancelled mid-call
            raise
        finally:
            await pool.release(connection, timeout=self.timeout)  # (a no-op once released)

    async def close(self) -> None:
        """Close every connection: politely within a second (a database that does not
        answer would hold a polite close until its deadline), then at once."""
        self._closed = True
        if self._pool is not None:
            try:
                await asyncio.wait_for(self._pool.close(), timeout=min(self.timeout, 1.0))
            except (Exception, asyncio.TimeoutError):
                self._pool.terminate()


def _discard(connection: asyncpg.Connection) -> None:
    """Close a connection whose state is unknown (the pool replaces it); one the pool
    already took back, because it closed, needs nothing more."""
    with contextlib.suppress(asyncpg.InterfaceError):
        connection.terminate()


class ListenConnection:
    """A LISTEN connection; ``closed`` completes when the connection is lost."""

    def __init__(self, connection: asyncpg.Connection) -> None:
        self._connection = connection
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        connection.add_termination_listener(self._on_termination)

    def _on_termination(self, _connection: object) -> None:
        if not self.closed.done():
            self.closed.set_result(None)

    async def close(self) -> None:
        """Drop the connection (a LISTEN has nothing to finish, and a polite close would wait
        for a server that may not answer)."""
        if not self._connection.is_closed():
            self._connection.terminate()
        self._on_termination(self._connection)
