"""agora_pg.testing, the pytest plugin for users' own handler tests: a small example
project (examples/testing_handlers) runs its tests with nothing but the plugin's fixtures."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import asyncpg

from tests.conftest import ROOT, Server

EXAMPLE = ROOT / "examples" / "testing_handlers"


async def _agora_databases(server: Server) -> set[str]:
    connection = await asyncpg.connect(server.url("postgres"))
    try:
        rows = await connection.fetch("SELECT datname FROM pg_database WHERE datname LIKE 'agora\\_%'")
        return {row["datname"] for row in rows}
    finally:
        await connection.close()


async def test_the_example_projects_tests_pass_with_the_plugins_fixtures_and_leave_no_database(
    pg_server: Server,
) -> None:
    before = await _agora_databases(pg_server)
    env = {**os.environ, "AGORA_PG_TEST_DATABASE_URL": pg_server.url("postgres")}
    env.pop("PYTEST_ADDOPTS", None)
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert "4 passed" in finished.stdout, finished.stdout
    assert await _agora_databases(pg_server) == before  # every clone and the template dropped


async def test_without_a_url_the_plugin_starts_the_embedded_server_and_a_wrong_expectation_fails(
    tmp_path: Path,
) -> None:
    test_file = EXAMPLE / "test_shop.py"
    broken = test_file.read_text().replace('assert ran.result == {"sum": 5}', 'assert ran.result == {"sum": 6}')
    target = tmp_path / "test_broken.py"
    target.write_text(broken)
    (tmp_path / "pytest.ini").write_text((EXAMPLE / "pytest.ini").read_text())
    env = {**os.environ, "PYTHONPATH": str(EXAMPLE)}
    env.pop("AGORA_PG_TEST_DATABASE_URL", None)  # the embedded server, in tmp_path/.agora-pg
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "add_returns", str(target)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 1, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert "{'sum': 5} == {'sum': 6}" in finished.stdout
    assert (tmp_path / ".agora-pg" / "test-pgdata").is_dir()
