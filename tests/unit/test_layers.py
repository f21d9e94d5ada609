"""The pure layer imports no database driver; URLs convert for each driver."""

import subprocess
import sys

import pytest

from agora_pg.db.connect import Database
from agora_pg.errors import ConfigError

PURE_MODULES = [
    "agora_pg.jobs", "agora_pg.retry", "agora_pg.settings", "agora_pg.job_spec", "agora_pg.errors", "agora_pg.schedules",
    "agora_pg.config", "agora_pg.families", "agora_pg.outcomes", "agora_pg.payloads", "agora_pg.limits",
    "agora_pg.commands.tables",
]


def test_pure_modules_load_no_database_driver() -> None:
    code = (
        "import sys\n"
        + "".join(f"import {name}\n" for name in PURE_MODULES)
        + "loaded = [m for m in ('sqlalchemy', 'asyncpg', 'alembic', 'psycopg') if m in sys.modules]\n"
        + "print(','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_database_url_forms() -> None:
    database = Database("postgres://u:secret@h:5433/db")
    assert database.asyncpg_url == "postgresql://u:secret@h:5433/db"
    assert database.sqlalchemy_url == "postgresql+asyncpg://u:secret@h:5433/db"
    assert database.display_url == "postgresql://u:***@h:5433/db"
    socket = Database("postgresql+asyncpg://postgres@/postgres?host=/tmp/sock")
    assert socket.asyncpg_url == "postgresql://postgres@/postgres?host=/tmp/sock"


def test_database_url_rejects_other_schemes() -> None:
    with pytest.raises(ConfigError, match="expected a postgresql:// URL"):
        Database("mysql://root@localhost/db")


def test_public_names_resolve_from_the_package() -> None:
    import agora_pg

    for name in agora_pg.__all__:
        assert getattr(agora_pg, name) is not None
    with pytest.raises(AttributeError):
        agora_pg.NoSuchThing  # noqa: B018


def test_pipelines_do_not_import_the_runner() -> None:
    """The runner runs pipelines; pipelines know nothing of the runner (no import cycle)."""
    code = "import sys, agora_pg.pipelines\nprint([m for m in sys.modules if m.startswith('agora_pg.runner')])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_api_does_not_import_the_command_line() -> None:
    """The API and the CLI both compose the layers below them; neither reaches into the other."""
    code = "import sys, agora_pg.api\nprint([m for m in sys.modules if m.startswith('agora_pg.commands')])"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
