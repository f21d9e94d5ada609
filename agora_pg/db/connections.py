"""The Store's own connections: which errors mean "the connection is gone" or "try
again", a small set of connections with every call under a deadline, and the
LISTEN connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

import asyncpg


class StatementRunner(Protocol):
    """What the table classes (``store.jobs``, ``.runs``, ``.schedules``, ``.workers``) need
    of the ``Store`` that owns them: its statements, run on its connections."""

    def connection(self) -> contextlib.AbstractAsyncContextManager[asyncpg.Connection]: ...

    async def execute(self, sql: str, *args: Any) -> None: ...

    async def fetch(self, sql: str, *args: Any, timeout: float | None = None) -> list[asyncpg.Record]: ...

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


class ConnectionPool:
    """The Store's own asyncpg connections: a LIFO list of idle ones, at most
    ``max_size`` in use at once, every call under a deadline (``command_timeout``).

    Taking and returning a connection are list operations: no ping, no reset query,
    no task. (asyncpg's own pool wraps every acquire and release in a task of its
    own: 30-40 us a statement, a sixth of a claim-and-complete cycle at concurrency
    10.) What makes reuse safe: a connection goes back to the list only after a call
    that returned, or that the server refused with an error the protocol has read to
    its end (a ``PostgresError`` that is neither a lost connection nor transient),
    and only if it is not inside a transaction. Anything else (a lost connection, a
    call past its deadline, a cancel mid-call, a client-side protocol error such as
    one arriving while the server closes the connection, a transient server error)
    closes it; a lost one also closes the idle ones, since a server restart kills
    them all.
    """

    def __init__(self, url: str, max_size: int, timeout: float, options: Mapping[str, object] | None = None) -> None:
        self._url = url
        self._options = dict(options or {})  # more asyncpg.connect() arguments
        self.timeout = timeout
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(max_size)
        self._closed = False

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._slots:
            connection = await self._take()
            try:
                yield connection
            except asyncpg.PostgresError as error:
                if isinstance(error, CONNECTION_ERRORS) or is_transient(error):
                    self._discard(connection, error)
                else:
                    self._give_back(connection)  # the server refused a statement; the connection is fine
                raise
            except BaseException as error:
                self._discard(connection, error)
                raise
            else:
                self._give_back(connection)

    async def _take(self) -> asyncpg.Connection:
        if self._closed:
            raise asyncpg.InterfaceError("the Store is closed")
        while self._idle:
            connection = self._idle.pop()
            if not connection.is_closed():
                return connection
        try:
            return await asyncpg.connect(self._url, timeout=self.timeout, command_timeout=self.timeout,
                                         **self._options)
        except asyncpg.PostgresError as error:
            if is_transient(error):  # too many connections, the server starting up or shutting down
                raise
            raise CannotConnect(str(error)) from error  # refused: no such database, authentication...

    def _give_back(self, connection: asyncpg.Connection) -> None:
        if self._closed or connection.is_closed() or connection.is_in_transaction():
            _discard(connection)
        else:
            self._idle.append(connection)

    def _discard(self, connection: asyncpg.Connection, error: BaseException) -> None:
        _discard(connection)
        if isinstance(error, CONNECTION_ERRORS):
            idle, self._idle = self._idle, []
            for other in idle:
                _discard(other)

    def drop_idle(self) -> None:
        """Close the idle connection unused the longest, if any: its server slot is
        wanted by a connection that cannot open without one (the LISTEN connection
        under a role's or server's connection limit)."""
        if self._idle:
            _discard(self._idle.pop(0))

    async def close(self) -> None:
        """Close every idle connection: politely within a second (a database that does
        not answer would hold a polite close until its deadline), then at once."""
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            try:
                await asyncio.wait_for(connection.close(), timeout=min(self.timeout, 1.0))
            except (Exception, asyncio.TimeoutError):
                _discard(connection)


def _discard(connection: asyncpg.Connection) -> None:
    """Close a connection whose state is unknown, at once."""
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
