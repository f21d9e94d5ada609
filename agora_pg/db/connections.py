"""The Store's own connections: errors that mean "the connection is gone", a small
set of idle asyncpg connections, and the dedicated LISTEN connection."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import asyncpg

CONNECTION_ERRORS = (
    OSError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.AdminShutdownError,
    ConnectionError,
)



class CannotConnect(ConnectionError):
    """The server refused a new connection (counted as a connection error)."""


class IdleConnections:
    """The Store's own asyncpg connections: a LIFO list of idle ones, at most
    ``limit`` in use at once.

    Taking and returning a connection are list operations: no ping and no reset
    query, which in SQLAlchemy's pool (and asyncpg's) cost a round trip or a
    greenlet hop per call, half the time of a single enqueue. A connection that
    broke, or was left inside a transaction, is closed instead of reused; a broken
    one also empties the idle list, since a server restart kills them all.
    """

    def __init__(self, url: str, limit: int) -> None:
        self._url = url
        self._idle: list[asyncpg.Connection] = []
        self._slots = asyncio.Semaphore(limit)
        self._closed = False

    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[asyncpg.Connection]:
        async with self._slots:
            connection = await self._take()
            try:
                yield connection
            except CONNECTION_ERRORS:
                connection.terminate()
                self._drop_idle()
                raise
            except Exception:
                self._give_back(connection)  # a query failed; the connection is fine
                raise
            except BaseException:
                connection.terminate()  # cancelled mid-query: its protocol state is unknown
                raise
            else:
                self._give_back(connection)

    async def _take(self) -> asyncpg.Connection:
        while self._idle:
            connection = self._idle.pop()
            if not connection.is_closed():
                return connection
        try:
            return await asyncpg.connect(self._url)
        except asyncpg.PostgresError as error:  # refused by the server: no such database, auth...
            raise CannotConnect(str(error)) from error

    def _give_back(self, connection: asyncpg.Connection) -> None:
        if self._closed or connection.is_closed() or connection.is_in_transaction():
            connection.terminate()
        else:
            self._idle.append(connection)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.terminate()

    async def close(self) -> None:
        self._closed = True
        idle, self._idle = self._idle, []
        for connection in idle:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(connection.close(), timeout=5)


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
        if not self._connection.is_closed():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._connection.close(), timeout=5)
        self._on_termination(self._connection)
