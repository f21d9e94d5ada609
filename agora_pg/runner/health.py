"""HealthServer: ``GET /health`` (live) and ``GET /ready`` (database and pipelines), JSON.

A few lines of asyncio rather than a web framework: two fixed routes, HTTP/1.1,
one request per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from agora_pg.errors import ConfigError

log = logging.getLogger("agora_pg.runner")

Report = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 400: "Bad Request", 503: "Service Unavailable"}


class HealthServer:
    """Serves ``live()`` on /health and ``ready()`` on /ready; each returns
    ``(healthy, body)`` and an unhealthy answer is a 503."""

    def __init__(self, port: int, live: Report, ready: Report, host: str = "0.0.0.0") -> None:
        self.host = host
        self.port = port
        self._routes = {"/health": live, "/ready": ready}
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        try:
            self._server = await asyncio.start_server(self._handle, self.host, self.port)
        except OSError as error:
            raise ConfigError(
                "health_port", f"the health server cannot listen on {self.host}:{self.port}: {error.strerror or error}; "
                "pick another port with --health-port or WORKER_HEALTH_PORT (0: any free port)"
            ) from None
        self.port = self._server.sockets[0].getsockname()[1]
        log.info("health server on http://%s:%d/health and /ready", self.host, self.port)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await asyncio.wait_for(self._respond(reader), timeout=10)
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            status, body = 400, {"error": "bad request"}
        payload = json.dumps(body).encode()
        head = (
            f"HTTP/1.1 {status} {REASONS.get(status, 'OK')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\nConnection: close\r\n\r\n"
        )
        with contextlib.suppress(ConnectionError):
            writer.write(head.encode() + payload)
            await writer.drain()
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[int, dict[str, Any]]:
        request_line = (await reader.readline()).decode("latin-1").split()
        while (await reader.readline()) not in (b"\r\n", b"\n", b""):
            pass  # headers are not needed
        if len(request_line) != 3:
            return 400, {"error": "bad request"}
        method, target, _version = request_line
        route = self._routes.get(target.split("?", 1)[0])
        if route is None:
            return 404, {"error": f"no such path {target!r}; try /health or /ready"}
        if method not in ("GET", "HEAD"):
            return 405, {"error": "only GET"}
        healthy, body = await route()
        return (200 if healthy else 503), body
