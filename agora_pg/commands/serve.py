"""``agora-pg api`` (the API under uvicorn) and ``agora-pg dev`` (embedded Postgres,
migrations, the API and a worker, in one process tree)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from agora_pg.db import migrate
from agora_pg.db.connect import resolve_database
from agora_pg.db.store import Store
from agora_pg.errors import AgoraError, ConfigError
from agora_pg.lifecycle import shutdown_signals
from agora_pg.runtime.http import quiet_server, read_deadline_protocol
from agora_pg.settings import load_settings

log = logging.getLogger("agora_pg")

CHILD_EXTRA_STOP_SECONDS = 10.0  # beyond the worker's own shutdown timeout


def check_bind(host: str, token: str | None, insecure: bool) -> None:
    """Serving beyond this machine needs a token, unless the operator insists."""
    from agora_pg.api.exposure import is_loopback_host

    if not is_loopback_host(host) and token is None and not insecure:
        raise ConfigError(
            "--host",
            f"refusing to serve on {host} without AGORA_PG_API_TOKEN; set a token, bind 127.0.0.1, "
            "or pass --insecure",
        )


async def run_api(host: str, port: int, insecure: bool, log_level: str, module: str | None = None) -> None:
    import uvicorn

    from agora_pg.api import create_app
    from agora_pg.loading import load_worker

    settings = load_settings(os.environ)
    check_bind(host, settings.api_token, insecure)
    check_port_free("--port", host, port)
    # the worker module's kinds: POST /jobs checks their payload types and applies their defaults
    handlers = load_worker(module, Path.cwd()) if module is not None else None
    app = create_app(settings, allow_remote=insecure, handlers=handlers)
    protocol = read_deadline_protocol(settings.api_read_timeout, settings.api_max_connections_per_client)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level.lower(), log_config=None,  # (ours)
                            lifespan="on", access_log=False, http=protocol,
                            limit_concurrency=settings.api_max_connections,
                            timeout_keep_alive=settings.api_keep_alive_seconds)
    # The worker's signal semantics: the first SIGINT/SIGTERM stops gracefully and the
    # process exits 0; a second one skips the wait. (uvicorn's own handlers re-raise the
    # signal after shutdown, which ends the process with -SIGTERM, as if it had been killed.)
    server = quiet_server(config)
    with shutdown_signals(lambda: setattr(server, "should_exit", True),
                          lambda: setattr(server, "force_exit", True)):
        await server.serve()
    if not server.started:
        raise AgoraError(f"the API could not start on {host}:{port} (see the log above)")


async def run_dev(host: str, port: int, module: str, health_port: int | None, log_level: str) -> None:
    """Start the embedded server (without a URL), migrate, then run the API and a worker
    as child processes until SIGINT/SIGTERM; the server lives as long as this process."""
    settings = load_settings(os.environ)
    check_bind(host, settings.api_token, insecure=False)
    if "." not in module and not (Path.cwd() / f"{module}.py").exists():
        raise ConfigError("--module", f"no {module}.py in {Path.cwd()}: run agora-pg dev where worker.py is")
    # Every port is checked before anything starts; the worker's health server gets a free
    # port of its own unless --health-port names one (the module's own may be taken).
    check_port_free("--port", host, port)
    if health_port is None:
        health_port = free_port(HEALTH_HOST)
    else:
        check_port_free("--health-port", HEALTH_HOST, health_port)
    async with resolve_database(settings) as database:
        store = Store.open(database, pool_size=1)
        try:
            await migrate.upgrade(store)
        finally:
            await store.close()
        env = {**os.environ, "AGORA_PG_DATABASE_URL": database.asyncpg_url}
        base = [sys.executable, "-m", "agora_pg.cli", "--log-level", log_level]
        worker_args = [*base, "worker", "--module", module, "--health-port", str(health_port)]
        children = {
            "api": _start([*base, "api", "--host", host, "--port", str(port), "--module", module], env),
            "worker": _start(worker_args, env),
        }
        print(
            f"agora-pg dev: database {database.display_url}\n"
            f"agora-pg dev: dashboard on http://{host}:{port}/ (live jobs, progress and schedules)\n"
            f"agora-pg dev: API on http://{host}:{port} (OpenAPI at /schema), worker running {module}.py\n"
            f"agora-pg dev: worker health on http://127.0.0.1:{health_port}/health, /ready and /metrics\n"
            "agora-pg dev: Ctrl+C stops both",
            flush=True,
        )
        try:
            await _supervise(children, settings.shutdown_timeout)
        finally:
            for child in children.values():
                _kill(child)


HEALTH_HOST = "127.0.0.1"  # where a WorkerPool's health server listens by default


def check_port_free(option: str, host: str, port: int) -> None:
    """One readable line, before anything starts, if ``port`` cannot be listened on."""
    if not 0 <= port <= 65535:
        raise ConfigError(option, f"must be a port number, got {port}")
    if port == 0:
        return
    try:
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers themselves do
            probe.bind((host, port))
    except OSError as error:
        raise ConfigError(option, f"port {port} on {host} is not free ({error.strerror or error}); "
                                  f"pick another with {option}") from None


def free_port(host: str) -> int:
    with socket.socket(socket.AF_INET) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _start(args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
    # A session of its own: Ctrl+C reaches only this process, which stops the
    # children once, gracefully (a second SIGINT would make the worker skip its grace).
    return subprocess.Popen(args, env=env, start_new_session=True)


async def _supervise(children: dict[str, subprocess.Popen[bytes]], shutdown_timeout: float) -> None:
    stop = asyncio.Event()
    with shutdown_signals(stop.set, stop.set):
        while not stop.is_set():
            exited = [name for name, child in children.items() if child.poll() is not None]
            if exited:
                name = exited[0]
                for child in children.values():
                    _terminate(child)
                await _wait_all(children, shutdown_timeout)
                raise AgoraError(f"the {name} process exited with code {children[name].returncode}; stopped the rest")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    log.info("stopping the API and the worker")
    for child in children.values():
        _terminate(child)
    await _wait_all(children, shutdown_timeout)


async def _wait_all(children: dict[str, subprocess.Popen[bytes]], shutdown_timeout: float) -> None:
    deadline = asyncio.get_running_loop().time() + shutdown_timeout + CHILD_EXTRA_STOP_SECONDS
    while any(child.poll() is None for child in children.values()):
        if asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.1)


def _terminate(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)


def _kill(child: subprocess.Popen[bytes]) -> None:
    if child.poll() is None:
        child.kill()
        child.wait()
