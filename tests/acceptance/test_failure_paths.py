"""Failure paths with real `agora-pg worker` processes: a claim whose reply is lost, a
database that goes silent, backends terminated or cancelled under a worker, transient
server errors, handlers that block the event loop or kill their process, a sync
handler at shutdown. Executions are counted in a ledger of files (see worker_app), so
a duplicate or an overlap shows even while the database is away."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest

from agora_pg import JobSpec, Queue
from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import TransientDatabaseError

from ..conftest import Processes, Server
from ..faults import PgProxy, PrivateServer, expire_leases_of, free_port, proxied
from .test_scheduled_processes import start_pool
from .test_worker_processes import eventually, scalar, start_worker, stop

pytestmark = pytest.mark.acceptance


@dataclasses.dataclass
class Execution:
    job_id: int
    attempt: int
    pid: int
    started: float
    ended: float | None = None  # returned normally
    stopped: float | None = None  # stopped by agora-pg (timeout, lease, shutdown)


def executions(ledger_dir: Path) -> list[Execution]:
    """Every execution the handlers wrote to the ledger files, in start order."""
    found: dict[tuple[int, int, int], Execution] = {}
    for path in ledger_dir.glob("[0-9]*.log"):  # (pipeline runs write pipeline-<pid>.log)
        for line in path.read_text().splitlines():
            job, attempt, pid, event, at = line.split()
            key = (int(job), int(attempt), int(pid))
            if event == "start":
                found[key] = Execution(*key, started=float(at))
            elif event == "end":
                found[key].ended = float(at)
            else:
                found[key].stopped = float(at)
    return sorted(found.values(), key=lambda execution: execution.started)


def completed_once(ledger_dir: Path) -> dict[int, int]:
    """Job id -> how many executions ran to their end."""
    counts: dict[int, int] = defaultdict(int)
    for execution in executions(ledger_dir):
        if execution.ended is not None:
            counts[execution.job_id] += 1
    return counts


@pytest.fixture
def ledger_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "ledger"
    directory.mkdir()
    return directory


def dbname(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


@pytest.fixture
def proxy(pg_server: Server) -> Iterator[PgProxy]:
    with proxied(pg_server.host, pg_server.port) as running_proxy:
        yield running_proxy


async def job_row(url: str, job_id: int) -> asyncpg.Record:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetchrow("SELECT * FROM agora.jobs WHERE id = $1", job_id)
    finally:
        await connection.close()


async def run_rows(url: str, job_id: int) -> list[tuple[int, str, str | None]]:
    connection = await asyncpg.connect(url)
    try:
        rows = await connection.fetch(
            "SELECT attempt, status, error_type FROM agora.runs WHERE job_id = $1 ORDER BY attempt, id", job_id
        )
    finally:
        await connection.close()
    return [(row["attempt"], row["status"], row["error_type"]) for row in rows]


async def status_of(url: str, job_id: int) -> str:
    return str(await scalar(url, "SELECT status FROM agora.jobs WHERE id = $1", job_id))


async def all_done(url: str, count: int) -> bool:
    return await scalar(url, "SELECT count(*) FROM agora.jobs WHERE status = 'done'") == count


def alive(process: subprocess.Popen[bytes]) -> bool:
    return process.poll() is None


def exit_output(process: subprocess.Popen[bytes]) -> str:
    """What a process that has exited printed."""
    return process.communicate(timeout=10)[0].decode(errors="replace")


# -- a claim whose reply is lost -----------------------------------------------------------


async def test_a_claim_whose_reply_is_lost_is_run_by_its_worker_at_once(
    queue: Queue, database_url: str, proxy: PgProxy, processes: Processes, ledger_dir: Path
) -> None:
    job = await queue.enqueue("ledger")
    proxy.lose_reply_to(b"SET status = 'processing'")  # the worker's first claim commits, unanswered
    worker = start_worker(processes, proxy.url(dbname(database_url)), WORKER_LEASE_SECONDS="300",
                          LEDGER_DIR=str(ledger_dir))
    # (a rescue would come only after the 300 s lease: done within the wait, the worker ran it itself)
    await eventually(lambda: status_is_done(database_url, job.id), 60, "the job running despite the lost reply")
    code, output = stop(worker)
    assert code == 0, output
    assert proxy.replies_lost == 1
    assert "claimed by a call whose reply was lost" in output, output
    assert completed_once(ledger_dir) == {job.id: 1}
    assert await run_rows(database_url, job.id) == [(1, "succeeded", None)]
    assert (await job_row(database_url, job.id))["lost_count"] == 0


async def status_is_done(url: str, job_id: int) -> bool:
    return await status_of(url, job_id) == "done"


# -- a database that goes silent -----------------------------------------------------------


@pytest.mark.connections(20)
async def test_sigterm_stops_a_worker_whose_database_is_silent(
    database_url: str, proxy: PgProxy, processes: Processes
) -> None:
    url = proxy.url(dbname(database_url))
    graceful = start_worker(processes, url, AGORA_PG_DATABASE_TIMEOUT="3")
    hurried = start_worker(processes, url, AGORA_PG_DATABASE_TIMEOUT="3")
    await eventually(lambda: _workers_registered(database_url, 2), 30, "both workers starting")
    # (registered is not started: a worker declares its kinds after its row is written, and
    # one whose declaration the silence catches stops "before it registered", with no step
    # left for a second signal to skip; a worker LISTENs once it has started)
    await eventually(lambda: _workers_listening(database_url, 2), 30, "both workers started")
    proxy.hold()  # nothing refused, nothing answered
    await asyncio.sleep(1.0)
    os.kill(graceful.pid, signal.SIGTERM)
    os.kill(hurried.pid, signal.SIGTERM)
    await asyncio.sleep(0.5)
    os.kill(hurried.pid, signal.SIGTERM)  # the second signal: stop at once
    # (no elapsed time is asserted: each exits, and its log says which steps it skipped)
    for process in (hurried, graceful):
        await asyncio.to_thread(process.wait, 120)
    outputs = [process.stdout.read().decode(errors="replace") if process.stdout else "" for process in (hurried, graceful)]
    # the second signal: the steps left are skipped (wherever the first signal's shutdown was)
    assert "stopped at once" in outputs[0] or "skipped (stopping at once)" in outputs[0], outputs[0]
    # every step at shutdown has a deadline, and once one got no answer the later ones are skipped
    assert "recording the worker's stop at shutdown: skipped (the database did not answer" in outputs[1], outputs[1]
    assert hurried.returncode == graceful.returncode == 0, outputs


async def _registered(url: str, pid: int) -> bool:
    """The worker process ``pid`` registered (its signal handlers are in place by then)."""
    return bool(await scalar(url, "SELECT count(*) FROM agora.workers WHERE pid = $1", pid))


async def _workers_listening(url: str, count: int) -> bool:
    """``count`` connections to the test's database have LISTENed (one per started worker)."""
    return await scalar(url, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                             "AND query LIKE 'LISTEN%'") == count


async def _workers_registered(url: str, count: int) -> bool:
    """Exactly ``count`` job workers registered (a pool running pipelines has a row too)."""
    return await scalar(url, "SELECT count(*) FROM agora.workers WHERE NOT 'agora:pipelines' = ANY(queues)") == count


async def test_a_stall_longer_than_the_lease_never_runs_a_job_or_a_pipeline_twice_at_once(
    processes: Processes, ledger_dir: Path
) -> None:
    """The test's own PostgreSQL is stopped for longer than the lease while a 6 s job and a
    6 s pipeline run: the workers stop them before their leases expire, and after the
    restart they run again, never beside an earlier execution."""
    server = PrivateServer()
    try:
        url = server.url()
        store = Store.open(Database(url), pool_size=1)
        try:
            await migrate.upgrade(store)
            [job] = await store.jobs.enqueue([JobSpec("ledger", {"seconds": 6})])
        finally:
            await store.close()
        job_id = job[0].id
        workers = [start_worker(processes, url, LEDGER_DIR=str(ledger_dir), AGORA_PG_DATABASE_TIMEOUT="2",
                                WORKER_LEASE_SECONDS="2") for _ in range(2)]
        health_ports = [free_port(), free_port()]
        pools = [start_pool(processes, url, "--health-port", str(port), PIPELINE_SCHEDULE="every1s",
                            PIPELINE_SLEEP="6", PIPELINE_BACKOFF="0.2", LEDGER_DIR=str(ledger_dir),
                            AGORA_PG_DATABASE_TIMEOUT="2", WORKER_LEASE_SECONDS="2") for port in health_ports]
        # every process is up (a process that starts while the server stops exits 1, as it should)
        await eventually(lambda: _workers_registered(url, 2), 30, "both job workers starting")
        for port in health_ports:
            await eventually(lambda port=port: _ready(port), 30, f"the pool on port {port} ready")
        await eventually(lambda: _job_and_pipeline_running(ledger_dir), 30, "the job and a pipeline run starting")
        await asyncio.to_thread(server.stop, "fast")
        await asyncio.sleep(2 * 2 + 1)  # two 2 s leases and more
        await asyncio.to_thread(server.start)
        await eventually(lambda: status_is_done(url, job_id), 60, "the job running to its end after the restart")
        await eventually(lambda: _pipeline_ended(ledger_dir), 60, "a pipeline run ending after the restart")
        for process in workers + pools:
            if not alive(process):
                output = exit_output(process)
                raise AssertionError(f"a process exited with {process.returncode}:\n{output[-6000:]}")
            code, output = stop(process)
            assert code == 0, output[-5000:]
        job_executions = [e for e in executions(ledger_dir) if e.job_id == job_id]
        assert sum(1 for e in job_executions if e.ended is not None) == 1
        assert job_executions[0].stopped is not None  # the first was stopped when its lease could not be renewed
        _assert_never_two_at_once([(e.started, e.ended or e.stopped) for e in job_executions])
        _assert_never_two_at_once(_pipeline_runs(ledger_dir))
        final = await job_row(url, job_id)
        assert (final["status"], final["retry_count"]) == ("done", 0)
    finally:
        server.cleanup()


async def _ready(port: int) -> bool:
    import httpx

    try:
        async with httpx.AsyncClient() as client:
            return (await client.get(f"http://127.0.0.1:{port}/ready", timeout=2)).status_code == 200
    except httpx.HTTPError:
        return False


def _job_and_pipeline_running(ledger_dir: Path) -> bool:
    files = list(ledger_dir.glob("*.log"))
    return any(f.name.startswith("pipeline-") for f in files) and any(not f.name.startswith("pipeline-") for f in files)


def _pipeline_runs(ledger_dir: Path) -> list[tuple[float, float | None]]:
    order: list[tuple[float, float | None]] = []
    for path in ledger_dir.glob("pipeline-*.log"):
        started: float | None = None
        for line in path.read_text().splitlines():
            _kind, _pid, event, at = line.split()
            if event == "start":
                started = float(at)
            elif started is not None:
                order.append((started, float(at)))
                started = None
        if started is not None:
            order.append((started, None))
    return sorted(order)


def _pipeline_ended(ledger_dir: Path) -> bool:
    return any(line.split()[2] == "end" for path in ledger_dir.glob("pipeline-*.log")
               for line in path.read_text().splitlines())


def _assert_never_two_at_once(intervals: list[tuple[float, float | None]]) -> None:
    intervals = sorted(intervals)
    for (start, end), (next_start, _next_end) in zip(intervals, intervals[1:]):
        assert end is not None, f"an execution that started at {start} has no end, yet another began"
        assert next_start >= end, f"two executions at once: one until {end}, the next from {next_start}"


# -- backends terminated or cancelled, transient server errors ------------------------------


@pytest.mark.connections(20)
@pytest.mark.parametrize("fault", ["terminate", "cancel"])
async def test_a_worker_keeps_draining_while_its_backends_are_killed(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path, fault: str
) -> None:
    workers = [start_worker(processes, database_url, "--concurrency", "20", LEDGER_DIR=str(ledger_dir),
                            WORKER_LEASE_SECONDS="5") for _ in range(2)]

    async def both_registered() -> bool:  # (a worker stopped before it handles SIGTERM would exit -15)
        return bool(await scalar(database_url, "SELECT count(*) FROM agora.workers") == 2)

    await eventually(both_registered, 60, "both workers registering")
    # the jobs come once both run, and last long enough (600 x 0.05 s over 40 slots) for strikes to land
    await queue.enqueue_many([JobSpec("ledger", {"seconds": 0.05}) for _ in range(600)])
    function = "pg_terminate_backend" if fault == "terminate" else "pg_cancel_backend"
    killer = await asyncpg.connect(database_url)
    # A strike lands only once the drain advanced since the last one: on a machine slow to
    # reconnect, strikes every 0.3 s would otherwise leave no session time to do anything.
    strikes, done_at_strike, stalled_since = 0, -1, time.monotonic()
    try:
        while (done := await scalar(database_url, "SELECT count(*) FROM agora.jobs WHERE status = 'done'")) < 600:
            assert all(alive(w) for w in workers), [exit_output(w)[-3000:] for w in workers if not alive(w)]
            if done > done_at_strike:
                strikes += await killer.fetchval(
                    f"SELECT count({function}(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                done_at_strike, stalled_since = done, time.monotonic()
            elif time.monotonic() - stalled_since > 30:
                details = await _unsettled(database_url)
                outputs = "\n".join(stop(w)[1][-4000:] for w in workers)
                raise AssertionError(f"no job done within 30 s of a strike: {details}\n{outputs}")
            await asyncio.sleep(0.3)
    finally:
        await killer.close()
    assert strikes > 0
    for worker in workers:
        assert alive(worker), f"a worker exited with {worker.returncode}:\n{exit_output(worker)[-5000:]}"
        code, output = stop(worker)
        assert code == 0, output[-3000:]
        assert "stopped unexpectedly" not in output and "crashed" not in output
    completions = completed_once(ledger_dir)
    assert len(completions) == 600
    # a job may complete twice only where its lease was lost (at-least-once), never otherwise
    twice = [job for job, count in completions.items() if count > 1]
    explained = await scalar(
        database_url, "SELECT count(*) FROM agora.jobs WHERE id = ANY($1::bigint[]) AND lost_count > 0", twice
    )
    assert explained == len(twice), twice


@pytest.mark.parametrize("cause", ["lock_timeout", "idle_session_timeout"])
async def test_transient_server_errors_are_waited_out(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path, cause: str
) -> None:
    name = dbname(database_url)
    setting = "lock_timeout = '100ms'" if cause == "lock_timeout" else "idle_session_timeout = '400ms'"
    await scalar(database_url, f'ALTER DATABASE "{name}" SET {setting}')
    worker = start_worker(processes, database_url, LEDGER_DIR=str(ledger_dir))
    await eventually(lambda: _workers_registered(database_url, 1), 30, "the worker starting")
    holder = await asyncpg.connect(database_url)
    try:
        if cause == "lock_timeout":  # as a migration holding the table would
            async with holder.transaction():
                await holder.execute("LOCK TABLE agora.jobs IN ACCESS EXCLUSIVE MODE")
                await asyncio.sleep(3)
            await queue.enqueue_many([JobSpec("ledger") for _ in range(20)])
        else:  # jobs trickling in at 10 a second while idle connections are closed under the worker
            for _ in range(30):
                await queue.enqueue("ledger")
                await asyncio.sleep(0.1)
    finally:
        await holder.close()
    expected = 20 if cause == "lock_timeout" else 30
    await eventually(lambda: all_done(database_url, expected), 30, "every job done")
    assert alive(worker)
    code, output = stop(worker)
    assert code == 0, output[-3000:]
    if cause == "lock_timeout":
        assert "retrying in" in output  # it said what it was waiting for
    assert set(completed_once(ledger_dir).values()) == {1}


# -- handlers that misbehave --------------------------------------------------------------


@pytest.mark.connections(20)
async def test_an_async_handler_blocking_the_loop_keeps_its_lease_and_is_named(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path
) -> None:
    job = await queue.enqueue("block_loop", {"seconds": 10})  # 2.5 leases of 4 s
    blocked = start_worker(processes, database_url, LEDGER_DIR=str(ledger_dir), WORKER_LEASE_SECONDS="4")
    await eventually(lambda: _started(ledger_dir, job.id), 30, "the job starting")
    other = start_worker(processes, database_url, LEDGER_DIR=str(ledger_dir))  # would rescue an expired lease
    await eventually(lambda: status_is_done(database_url, job.id), 30, "the job finishing")
    codes = [stop(worker) for worker in (blocked, other)]
    assert all(code == 0 for code, _output in codes), codes
    output = codes[0][1]
    assert "the event loop has been blocked for" in output
    assert f"job {job.id} (kind 'block_loop', handler worker_app.block_loop)" in output
    assert "make the handler a plain def" in output
    assert completed_once(ledger_dir) == {job.id: 1}
    assert await run_rows(database_url, job.id) == [(1, "succeeded", None)]


def _started(ledger_dir: Path, job_id: int) -> bool:
    return any(e.job_id == job_id for e in executions(ledger_dir))


@pytest.mark.connections(28)
async def test_a_job_that_kills_its_process_fails_alone_and_its_neighbours_keep_their_retries(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path
) -> None:
    neighbours = await queue.enqueue_many([JobSpec("ledger", {"seconds": 0.2}) for _ in range(200)])
    killer = await queue.enqueue("exit_process")
    workers = [start_worker(processes, database_url, "--concurrency", "10", LEDGER_DIR=str(ledger_dir))
               for _ in range(3)]
    deaths = 0
    deadline = time.monotonic() + 120
    while not (await all_done(database_url, 200) and await status_of(database_url, killer.id) == "failed"):
        assert time.monotonic() < deadline, f"the jobs did not settle: {await _unsettled(database_url)}"
        for index, worker in enumerate(workers):
            if not alive(worker):
                deaths += 1
                assert worker.returncode == 9
                await expire_leases_of(database_url, worker)  # (its jobs back now, not a lease later)
                workers[index] = start_worker(processes, database_url, "--concurrency", "10",
                                              LEDGER_DIR=str(ledger_dir))
        await asyncio.sleep(0.2)
    for worker in workers:  # (the last replacement may still be starting: SIGTERM would end it unhandled)
        await eventually(lambda worker=worker: _registered(database_url, worker.pid), 30, "the worker starting")
        code, output = stop(worker)
        assert code == 0, output[-3000:]
    failed = await job_row(database_url, killer.id)
    assert (failed["lost_count"], failed["retry_count"]) == (3, 0)
    assert failed["error_message"].endswith("(3 lost attempts: not retried)")
    assert deaths == 3
    connection = await asyncpg.connect(database_url)
    try:
        charged = await connection.fetchval(
            "SELECT count(*) FROM agora.jobs WHERE id = ANY($1::bigint[]) AND (retry_count > 0 OR status <> 'done')",
            [job.id for job in neighbours],
        )
    finally:
        await connection.close()
    assert charged == 0  # neighbours lost at most an attempt each, never their retries


async def _unsettled(url: str) -> str:
    """The jobs not done, with the workers (for a failure's message)."""
    connection = await asyncpg.connect(url)
    try:
        jobs = await connection.fetch("SELECT id, kind, status, attempt, lost_count, locked_by, run_at > now() AS later, "
                                      "lease_expires_at FROM agora.jobs WHERE status <> 'done' ORDER BY id LIMIT 20")
        workers = await connection.fetch("SELECT id, pid, stopped_at, lease_expires_at, lease_expires_at < now() "
                                         "AS expired FROM agora.workers ORDER BY started_at")
        runs = await connection.fetch("SELECT job_id, attempt, worker_id, status, started_at, finished_at FROM agora.runs "
                                      "WHERE job_id = ANY($1::bigint[]) ORDER BY job_id, id", [row["id"] for row in jobs])
    finally:
        await connection.close()
    return (f"jobs {[dict(row) for row in jobs]}; workers {[dict(row) for row in workers]}; "
            f"runs {[dict(row) for row in runs]}")


async def test_a_sync_handler_still_running_at_shutdown_is_not_released_beside_its_thread(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path
) -> None:
    job = await queue.enqueue("sync_sleep", {"seconds": 1, "first_seconds": 600})
    first = start_worker(processes, database_url, LEDGER_DIR=str(ledger_dir), WORKER_SHUTDOWN_TIMEOUT="0.5")
    await eventually(lambda: _started(ledger_dir, job.id), 30, "the job starting")
    code, output = stop(first, timeout=120)  # (its thread would run 600 s: it does not keep the process alive)
    assert code == 0, output
    exited_at = time.time()
    assert "still running in its thread: left as it is, not released" in output
    row = await job_row(database_url, job.id)
    assert row["status"] == "processing"  # not released while its thread might still run
    await expire_leases_of(database_url, first)
    second = start_worker(processes, database_url, LEDGER_DIR=str(ledger_dir))
    await eventually(lambda: status_is_done(database_url, job.id), 30, "another worker running it after the lease")
    code, output = stop(second)
    assert code == 0, output
    [cut, again] = [e for e in executions(ledger_dir) if e.job_id == job.id]
    assert cut.ended is None and again.ended is not None
    assert again.started > exited_at  # never beside the first thread
    assert (await job_row(database_url, job.id))["lost_count"] == 1


async def test_a_sync_handler_hung_past_its_timeout_is_recorded_and_its_process_asks_for_a_restart(
    queue: Queue, database_url: str, processes: Processes, ledger_dir: Path
) -> None:
    hung = await queue.enqueue("sync_sleep", {"seconds": 600}, timeout_seconds=1)
    neighbour = await queue.enqueue("ledger", {"seconds": 15})  # still running when the thread is given up
    port = free_port()
    worker = start_worker(processes, database_url, "--health-port", str(port), LEDGER_DIR=str(ledger_dir),
                          WORKER_SHUTDOWN_TIMEOUT="20", WORKER_LEASE_SECONDS="4")
    await eventually(lambda: _started(ledger_dir, hung.id) and _started(ledger_dir, neighbour.id), 30,
                     "both jobs starting")

    async def recorded() -> bool:  # its deadline (1 s) plus a lease (4 s) later
        return (await job_row(database_url, hung.id))["retry_count"] == 1
    await eventually(recorded, 60, "the hung attempt being recorded")
    row = await job_row(database_url, hung.id)
    assert (row["status"], row["delayed"], row["locked_by"]) == ("failed", True, None)  # to retry; slot, lease free
    assert row["error_message"].startswith("JobTimeout: ") and f"agora-job-{hung.id}" in row["error_message"]
    wait = await scalar(database_url, "SELECT extract(epoch FROM run_at - now()) FROM agora.jobs WHERE id = $1",
                        hung.id)
    assert wait > 60  # its retry is due only once this process has gone (shutdown_bound)
    assert await run_rows(database_url, hung.id) == [(1, "failed", "JobTimeout")]
    status, health = _get(port, "/health")
    assert status == 503 and health["status"] == "restart needed", health
    assert [(t["thread"], t["job_id"], t["kind"]) for t in health["stuck_threads"]] == [
        (f"agora-job-{hung.id}", hung.id, "sync_sleep")]
    metrics = _get(port, "/metrics")[1]
    assert f'agora_stuck_threads{{job_id="{hung.id}",kind="sync_sleep",thread="agora-job-{hung.id}"}}' in metrics

    code = await asyncio.to_thread(worker.wait, 60)  # once its neighbour has finished
    output = exit_output(worker)
    assert code == 1, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith("agora-pg: a sync handler's thread did not return") and f"agora-job-{hung.id}" in last
    assert "restart the process" in last
    assert await status_is_done(database_url, neighbour.id)  # it ran to its end, not cut short
    [ran] = [e for e in executions(ledger_dir) if e.job_id == neighbour.id]
    assert ran.ended is not None
    [left] = [e for e in executions(ledger_dir) if e.job_id == hung.id]
    assert left.ended is None and left.stopped is None  # (the thread ended with its process)


def _get(port: int, path: str) -> tuple[int, Any]:
    """GET a health server's ``path``: (status, JSON body or text)."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as answer:
            status, body = answer.status, answer.read().decode()
    except urllib.error.HTTPError as error:
        status, body = error.code, error.read().decode()
    return status, json.loads(body) if body.startswith("{") else body


# -- pipeline runs that kill their process ---------------------------------------------


async def test_a_pipeline_run_that_kills_its_process_backs_off_and_stops_the_schedule(
    database_url: str, processes: Processes
) -> None:
    env = {"PIPELINE_EXIT": "1", "PIPELINE_BACKOFF": "0.2", "PIPELINE_MAX_ERRORS": "3"}
    pool = start_pool(processes, database_url, **env)
    exits: list[int] = []
    deadline = time.monotonic() + 90
    while True:
        assert time.monotonic() < deadline, f"the schedule did not stop; exits so far {exits}"
        if alive(pool):
            await asyncio.sleep(0.2)
            continue
        exits.append(pool.returncode)
        if pool.returncode != 9:
            break
        pool = start_pool(processes, database_url, **env)
    output = pool.stdout.read().decode() if pool.stdout else ""
    assert exits == [9, 9, 9, 1], exits  # three runs killed their process; the fourth start stops
    assert "stopped after 3 consecutive errors" in output and "WorkerLost" in output
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow("SELECT state, consecutive_errors FROM agora.schedules")
        runs = await connection.fetch("SELECT status, error_type FROM agora.runs ORDER BY id")
    finally:
        await connection.close()
    assert (row["state"], row["consecutive_errors"]) == ("stopped", 3)
    assert [(r["status"], r["error_type"]) for r in runs] == [("abandoned", "WorkerLost")] * 3


async def test_a_worker_waits_out_a_connection_limit_that_refuses_its_listen_connection(
    processes: Processes, ledger_dir: Path
) -> None:
    """A role's connection limit refuses the worker's LISTEN connection (and, at times,
    another connection of its pool): the worker polls meanwhile and listens once a slot frees."""
    server = PrivateServer()
    try:
        store = Store.open(Database(server.url()), pool_size=1)
        try:
            await migrate.upgrade(store)
            await scalar(server.url(), "CREATE ROLE limited LOGIN CONNECTION LIMIT 4")
            for grant in ("GRANT USAGE ON SCHEMA agora TO limited",
                          "GRANT ALL ON ALL TABLES IN SCHEMA agora TO limited",
                          "GRANT ALL ON ALL SEQUENCES IN SCHEMA agora TO limited"):
                await scalar(server.url(), grant)
            limited = server.url().replace("postgres@", "limited@", 1)
            hogs = [await asyncpg.connect(limited) for _ in range(2)]  # two of the role's four connections
            worker = start_worker(processes, limited, LEDGER_DIR=str(ledger_dir))
            await store.jobs.enqueue([JobSpec("ledger") for _ in range(20)])
            await eventually(lambda: all_done(server.url(), 20), 60, "the jobs done by polling")
            assert alive(worker)
            for hog in hogs:
                await hog.close()
            await eventually(lambda: _listening_as(server.url(), "limited"), 30, "the worker listening again")
            await store.jobs.enqueue([JobSpec("ledger")])
            await eventually(lambda: all_done(server.url(), 21), 30, "a job after the slots freed")
        finally:
            await store.close()
        code, output = stop(worker)
        assert code == 0, output[-3000:]
        assert "too many connections for role" in output and "retrying in" in output
        assert set(completed_once(ledger_dir).values()) == {1}
        await _idle_pooled_connections_give_way_to_the_listener(limited)
    finally:
        server.cleanup()


async def _idle_pooled_connections_give_way_to_the_listener(limited: str) -> None:
    """A Store whose pool grew to take every slot of the role, all idle now: its
    LISTEN connection is refused once, and gets a slot on the next try."""
    store = Store.open(Database(limited), pool_size=2)  # up to four pooled connections: the role's limit
    try:
        await asyncio.gather(*(store.fetch("SELECT pg_sleep(0.3)") for _ in range(4)))
        with pytest.raises(TransientDatabaseError, match="too many connections"):
            await store.listen({"agora_jobs": lambda payload: None})
        listener = None
        for _ in range(50):  # the dropped connection's server process takes a moment to exit
            try:
                listener = await store.listen({"agora_jobs": lambda payload: None})
                break
            except TransientDatabaseError:
                await asyncio.sleep(0.1)
        assert listener is not None, "the listener never got the idle connection's slot"
        await listener.close()
    finally:
        await store.close()


async def _listening_as(url: str, role: str) -> bool:
    return bool(await scalar(
        url, "SELECT count(*) FROM pg_stat_activity WHERE usename = $1 AND query LIKE 'LISTEN %'", role
    ))
