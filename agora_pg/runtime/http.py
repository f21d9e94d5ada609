"""What agora-pg adds to uvicorn where it serves HTTP (the API, a worker's health server)."""

from __future__ import annotations

import asyncio


def read_deadline_protocol(read_timeout: float) -> type:
    """uvicorn's h11 protocol with a deadline on reading each request: a connection that
    has not sent a whole request (headers and body) ``read_timeout`` seconds after it
    opened, or after the previous response, is closed. (uvicorn alone never closes a
    connection that sends nothing, or half a request: each holds a file descriptor.)"""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class ReadDeadlineProtocol(H11Protocol):
        _read_deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm_read_deadline()

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
