"""What agora-pg adds to uvicorn where it serves HTTP (the API, a worker's health server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable, Iterator
from typing import Any


_TOO_MANY = b"too many connections from this address: try again shortly"
REFUSED_FOR_CLIENT = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                      b"retry-after: 5\r\nconnection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(_TOO_MANY), _TOO_MANY))


REFUSED_LINGER_SECONDS = 1.0


def read_deadline_protocol(read_timeout: float, per_client: int | None = None) -> type:
    """uvicorn's h11 protocol with a deadline on reading each request: a connection that
    has not sent a whole request (headers and body) ``read_timeout`` seconds after it
    opened, or after the previous response, is closed. (uvicorn alone never closes a
    connection that sends nothing, or half a request: each holds a file descriptor.)

    And when a new connection finds every slot (``limit_concurrency``) taken, the oldest
    idle connection (no request on it: opened and silent, or kept alive after an
    answer) is closed to make room, so that a flood of idle sockets, reopened as fast as
    they are closed, cannot keep every request out. Only connections busy with a request
    (or a stream, which has a cap of its own) make a new one wait for a 503.

    With ``per_client``, one client address holds at most that many connections: a new
    one past it closes that client's oldest idle connection, or (none idle) is answered
    503 and closed at once, so that one address cannot take the slots of the others."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ReadDeadlineProtocol(H11Protocol):
        _read_deadline: asyncio.TimerHandle | None = None
        _opened_at = 0.0
        _address: str | None = None
        _refused = False

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._opened_at = self.loop.time()
            self._arm_read_deadline()
            if per_client is not None:
                peer = transport.get_extra_info("peername")
                self._address = peer[0] if isinstance(peer, tuple) else None
                same = [c for c in self.connections if isinstance(c, ReadDeadlineProtocol)
                        and c._address == self._address and not c.transport.is_closing()]
                if len(same) > per_client:
                    self._evict_oldest_idle(len(same) - per_client, among=same)
                    if len([c for c in same if c in self.connections]) > per_client:
                        self._refuse(transport)
                        return
            limit = self.limit_concurrency
            if limit is not None and len(self.connections) >= limit:
                # (uvicorn answers 503 to a request while connections >= the limit, this one included)
                self._evict_oldest_idle(len(self.connections) - limit + 1)

        def _refuse(self, transport: asyncio.Transport) -> None:
            """Answer 503 before any request, and close once the client has had a moment to
            send its request (closing with it unread would reset the connection, answer lost)."""
            self._refused = True
            self.connections.discard(self)
            transport.write(REFUSED_FOR_CLIENT)
            if transport.can_write_eof():
                transport.write_eof()
            self.loop.call_later(REFUSED_LINGER_SECONDS, transport.close)

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def _is_idle(self) -> bool:
            return self.cycle is None and self.conn.their_state is h11.IDLE and not self.transport.is_closing()

        def _evict_oldest_idle(self, count: int, among: Iterable[object] | None = None) -> None:
            idle = [c for c in (self.connections if among is None else among)
                    if c is not self and isinstance(c, ReadDeadlineProtocol) and c._is_idle()]
            for connection in sorted(idle, key=lambda connection: connection._opened_at)[:count]:
                connection.transport.close()
                # (its connection_lost, which leaves the set too, comes a loop turn later:
                # after this connection's first request would have been counted)
                self.connections.discard(connection)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_read_deadline()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
            super().connection_lost(exc)

        def _arm_read_deadline(self) -> None:
            if self._read_deadline is not None:
                self._read_deadline.cancel()
            self._read_deadline = self.loop.call_later(read_timeout, self._read_timed_out)

        def _read_timed_out(self) -> None:
            # IDLE: no request yet (or none since the last response); SEND_BODY: half a body
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) and not self.transport.is_closing():
                self.transport.close()

    return ReadDeadlineProtocol


def quiet_server(config: Any) -> Any:
    """A uvicorn server for ``config`` that installs no signal handlers: the process's
    own (``lifecycle.shutdown_signals``) decide what SIGINT and SIGTERM do."""
    import uvicorn

    class QuietServer(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    return QuietServer(config)
