"""What a new user meets in the first hour at a shell: the CLI's flags, its logging,
misspelled settings, and `alembic upgrade head` as the design card uses it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

from agora_pg.db import migrate

from ..conftest import Processes
from .test_api_processes import wait_ready
from .test_worker_processes import free_port, output_until, worker_env

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.acceptance


def run(args: list[str], env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agora_pg.cli", *args]


def bare_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WORKER_", "AGORA_PG_", "DATABASE_URL"))}
    env.update(extra)
    return env


@pytest.mark.one_lane
def test_version_and_log_options_before_or_after_the_command(database_url: str) -> None:
    version = run(cli("--version"), worker_env(database_url))
    assert version.returncode == 0 and version.stdout.startswith("agora-pg ") and version.stdout.split()[1][0].isdigit()
    for args in (("--log-level", "DEBUG", "jobs", "list"), ("jobs", "list", "--log-level", "debug"),
                 ("schedules", "list", "--log-level", "WARNING")):
        result = run(cli(*args), worker_env(database_url))
        assert result.returncode == 0, (args, result.stderr)
    debug = run(cli("jobs", "list", "--log-level", "DEBUG"), worker_env(database_url))
    assert " DEBUG " in debug.stderr
    wrong = run(cli("jobs", "list", "--log-level", "LOUD"), worker_env(database_url))
    assert wrong.returncode == 2 and "invalid choice: 'LOUD'" in wrong.stderr
    from_env = run(cli("jobs", "list"), worker_env(database_url, AGORA_PG_LOG_LEVEL="loud"))
    assert from_env.returncode == 2 and from_env.stderr.strip() == (
        "agora-pg: AGORA_PG_LOG_LEVEL: expected DEBUG, INFO, WARNING, ERROR, got 'LOUD'")


def test_a_misspelled_setting_is_named_once_with_the_closest_known_one(database_url: str) -> None:
    result = run(cli("jobs", "list"), worker_env(database_url, WORKER_CONCURENCY="50", AGORA_PG_TOKEN="x",
                                                   AGORA_PG_XYZZY="1"))
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "unknown setting" in line]
    assert len(lines) == 3, result.stderr
    assert lines[0].endswith("unknown setting AGORA_PG_TOKEN (ignored); did you mean AGORA_PG_API_TOKEN?")
    assert lines[1].endswith("unknown setting AGORA_PG_XYZZY (ignored)")  # nothing close enough to suggest
    assert lines[2].endswith("unknown setting WORKER_CONCURENCY (ignored); did you mean WORKER_CONCURRENCY?")


def test_json_log_lines(database_url: str) -> None:
    result = run(cli("--log-format", "json", "jobs", "list", "--log-level", "DEBUG"),
                 worker_env(database_url, WORKER_CONCURENCY="5"))
    assert result.returncode == 0, result.stderr
    entries = [json.loads(line) for line in result.stderr.splitlines()]
    assert entries and all(set(entry) >= {"time", "level", "logger", "message"} for entry in entries)
    assert any(entry["level"] == "WARNING" and "WORKER_CONCURRENCY" in entry["message"] for entry in entries)
    from_env = run(cli("jobs", "list"), worker_env(database_url, AGORA_PG_LOG_FORMAT="xml"))
    assert from_env.returncode == 2 and "AGORA_PG_LOG_FORMAT: expected text or json" in from_env.stderr


def test_migrate_says_what_it_applied(fresh_db: str) -> None:
    first = run(cli("migrate"), worker_env(fresh_db))
    assert first.returncode == 0, first.stderr
    every = ", ".join(migrate.revisions_between(set(), migrate.head_revisions()))
    assert every.startswith("0001, 0002, ")
    assert f"applied migration(s) {every} to " in first.stderr
    assert "alembic" not in first.stderr  # Alembic's own INFO lines are for --log-level DEBUG
    again = run(cli("migrate"), worker_env(fresh_db))
    assert again.returncode == 0 and "nothing to apply" in again.stderr


def test_alembic_upgrade_head_logs_what_it_applied_and_says_one_line_for_a_wrong_url(fresh_db: str) -> None:
    alembic = [sys.executable, "-m", "alembic", "upgrade", "head"]
    applied = run(alembic, bare_env(AGORA_PG_DATABASE_URL=fresh_db))
    assert applied.returncode == 0, applied.stderr
    [head] = migrate.head_revisions()
    assert "Running upgrade  -> 0001" in applied.stderr and f"is at revision {head}" in applied.stderr
    for url, words in (("postgresql://postgres@127.0.0.1:1/nowhere", "alembic: cannot connect to"),
                       (urlunsplit(urlsplit(fresh_db)._replace(path="/no_such_database")), "does not exist"),
                       ("mysql://somewhere/db", "alembic: DATABASE_URL: expected a postgresql:// URL")):
        failed = run(alembic, bare_env(AGORA_PG_DATABASE_URL=url))
        assert failed.returncode != 0
        assert len(failed.stderr.strip().splitlines()) == 1 and words in failed.stderr, failed.stderr


@pytest.mark.one_lane
def test_embedded_mode_finds_the_projects_database_from_a_sub_folder_and_says_only_when_it_creates_one(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    deep = project / "src" / "deep"
    deep.mkdir(parents=True)
    env = bare_env()
    env.pop("XDG_RUNTIME_DIR", None)
    submitted = run(cli("jobs", "submit", "hello_from_the_root"), env, cwd=project)
    assert submitted.returncode == 0, submitted.stderr
    created = [line for line in submitted.stderr.splitlines() if "created an embedded PostgreSQL" in line]
    assert len(created) == 1 and str(project / ".agora-pg") in created[0], submitted.stderr
    assert "XDG_RUNTIME_DIR" not in submitted.stderr and "alembic" not in submitted.stderr, submitted.stderr
    listed = run(cli("jobs", "list"), env, cwd=deep)
    assert listed.returncode == 0, listed.stderr
    assert "hello_from_the_root" in listed.stdout, listed.stdout
    assert listed.stderr == "", listed.stderr  # found, not created: nothing to say
    assert not (deep / ".agora-pg").exists() and not (project / "src" / ".agora-pg").exists()


@pytest.mark.one_lane
def test_busy_ports_are_named_in_one_line_before_anything_starts(database_url: str, tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for args, option in ((("dev", "--port", str(port)), "--port"),
                             (("dev", "--port", str(free_port()), "--health-port", str(port)), "--health-port"),
                             (("api", "--port", str(port)), "--port")):
            result = run(cli(*args), bare_env(AGORA_PG_DATA_DIR=str(tmp_path / "never-started")))
            assert result.returncode == 2, result.stderr
            assert result.stderr.strip().splitlines() == [
                f"agora-pg: {option}: port {port} on 127.0.0.1 "
                f"is not free (Address already in use); pick another with {option}"]
            assert not (tmp_path / "never-started").exists()  # refused before the database was started
        worker = run(cli("worker", "--module", "worker", "--health-port", str(port)), worker_env(database_url))
        assert worker.returncode == 2, worker.stderr
        assert worker.stderr.strip().splitlines()[-1].startswith(
            f"agora-pg: health_port: the health server cannot listen on 127.0.0.1:{port}")
        assert "Traceback" not in worker.stderr


async def test_dev_gives_the_worker_a_free_health_port_when_the_modules_is_taken(
    database_url: str, processes: Processes
) -> None:
    with contextlib.ExitStack() as stack:
        try:  # worker.py asks for 8080: make sure it is taken (by something else, or by this test)
            taken = stack.enter_context(socket.socket())
            taken.bind(("0.0.0.0", 8080))
            taken.listen()
        except OSError:
            pass  # already in use
        port = free_port()
        dev = processes.start(cli("dev", "--port", str(port)), worker_env(database_url), REPO)
        base = f"http://127.0.0.1:{port}"
        await wait_ready(base, dev)
        started = await output_until(dev, "health server on")  # (the API may answer before the worker's)
        os.kill(dev.pid, signal.SIGINT)
        output, _ = dev.communicate(timeout=60)
    text = started + output.decode(errors="replace")
    assert dev.returncode == 0, text
    [line] = [line for line in text.splitlines() if "worker health on" in line]
    health_port = int(line.split("http://127.0.0.1:")[1].split("/")[0])
    assert health_port != 8080
    assert f"health server on http://127.0.0.1:{health_port}/health" in text
    # one log format: the API's uvicorn lines are agora-pg's too ("... INFO uvicorn.error: ..."), not "INFO:     ..."
    assert " INFO uvicorn.error: " in text
    assert not [line for line in text.splitlines() if line.startswith(("INFO:", "WARNING:", "ERROR:"))], text
