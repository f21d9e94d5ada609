"""HealthServer: a WorkerPool's ``GET /health`` (live), ``GET /ready`` (database and
pipelines) and ``GET /metrics`` (Prometheus), served by uvicorn.

A small ASGI app rather than a web framework (three fixed routes), under uvicorn rather
than a hand-written HTTP server: uvicorn parses HTTP properly, closes idle keep-alive
connections and caps concurrent ones (503 past ``MAX_CONNECTIONS``); a read deadline
closes connections that send nothing or half a request. It listens on
loopback unless told otherwise (``WORKER_HEALTH_HOST``); on loopback it also refuses
requests whose ``Host`` is not this machine (DNS rebinding), as the API does without a
token. Raw error texts (which may hold anything a pipeline's error said, URLs included)
stay out of its answers unless ``WORKER_HEALTH_ERROR_DETAILS`` asks for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from agora_pg.api.exposure import is_loopback_host, refusal
from agora_pg.errors import AgoraError, ConfigError
from agora_pg.runtime.http import quiet_server, read_deadline_protocol

log = logging.getLogger("agora_pg.runner")

Report = Callable[[], Awaitable[tuple[bool, dict[str, Any]]]]
Metrics = Callable[[], Awaitable[tuple[bytes, str]]]  # (body, content type)
DEFAULT_HOST = "127.0.0.1"
MAX_CONNECTIONS = 100  # concurrent connections and requests; 503 past it
KEEP_ALIVE_SECONDS = 5
READ_TIMEOUT_SECONDS = 10  # to send a whole request: a silent or slow connection is closed


class HealthServer:
    """Serves ``live()`` on /health, ``ready()`` on /ready (each returns ``(healthy,
    body)``; an unhealthy answer is a 503) and ``metrics()`` on /metrics."""

    def __init__(self, port: int, live: Report, ready: Report, host: str = DEFAULT_HOST,
                 metrics: Metrics | None = None) -> None:
        self.host = host
        self.port = port
        self._app = health_app({"/health": live, "/ready": ready}, metrics, remote=not is_loopback_host(host))
        self._server: Any = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        import uvicorn

        try:
            listening = socket.create_server((self.host, self.port), family=_family(self.host))
        except OSError as error:
            raise ConfigError(
                "health_port", f"the health server cannot listen on {self.host}:{self.port}: {error.strerror or error}; "
                "pick another port with --health-port or WORKER_HEALTH_PORT (0: any free port)"
            ) from None
        self.port = listening.getsockname()[1]
        config = uvicorn.Config(self._app, lifespan="off", log_config=None, access_log=False,
                                limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=KEEP_ALIVE_SECONDS,
                                http=read_deadline_protocol(READ_TIMEOUT_SECONDS))
        self._server = quiet_server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[listening]), name="health server")
        while not self._server.started and not self._task.done():
            await asyncio.sleep(0.01)
        if self._task.done():
            self._task.result()  # (raises what stopped it)
            raise ConfigError("health_port", f"the health server did not start on {self.host}:{self.port}")
        log.info("health server on http://%s:%d/health, /ready and /metrics", self.host, self.port)

    async def close(self) -> None:
        if self._server is None or self._task is None:
            return
        self._server.should_exit = True
        done, _ = await asyncio.wait([self._task], timeout=5)
        if not done:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


def health_app(routes: dict[str, Report], metrics: Metrics | None, *, remote: bool) -> Any:
    """The ASGI app: ``routes`` (path -> report) as JSON, ``metrics`` on /metrics."""

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        reason = refusal(scope, remote, ())
        if reason is not None:
            await _answer(send, 403, {"error": reason})
        elif scope["method"] not in ("GET", "HEAD"):
            await _answer(send, 405, {"error": "only GET"})
        elif scope["path"] == "/metrics" and metrics is not None:
            try:
                body, content_type = await metrics()
            except AgoraError as error:
                log.warning("health server: /metrics: %s", error)
                await _answer(send, 503, {"error": "the database is unavailable (the worker's log says why)"})
                return
            await _send(send, 200, body, content_type)
        elif scope["path"] in routes:
            healthy, report = await routes[scope["path"]]()
            await _answer(send, 200 if healthy else 503, report)
        else:
            await _answer(send, 404, {"error": f"no such path {scope['path'][:100]!r}; try /health, /ready or /metrics"})

    return app


async def _answer(send: Any, status: int, body: dict[str, Any]) -> None:
    await _send(send, status, json.dumps(body).encode(), "application/json")


async def _send(send: Any, status: int, body: bytes, content_type: str) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
