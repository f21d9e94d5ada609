"""Apply the Alembic migrations shipped inside the package."""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

from agora_pg.db.store import Store


def alembic_config() -> Config:
    """An Alembic config pointing at ``agora_pg/migrations`` wherever it is installed."""
    config = Config()
    config.set_main_option("script_location", str(resources.files("agora_pg") / "migrations"))
    return config


def revisions_between(applied: set[str], heads: set[str]) -> list[str]:
    """The revisions that lead from ``applied`` (empty: none) to ``heads``, oldest first."""
    script = ScriptDirectory.from_config(alembic_config())
    lower = next(iter(applied)) if len(applied) == 1 else "base"
    steps = [revision.revision for revision in script.iterate_revisions(tuple(heads), lower)]
    return [revision for revision in reversed(steps) if revision not in applied]


def head_revisions() -> set[str]:
    """The revisions ``upgrade head`` leads to."""
    return set(ScriptDirectory.from_config(alembic_config()).get_heads())


async def upgrade(store: Store, revision: str = "head") -> None:
    """Upgrade the schema to ``revision`` (idempotent; concurrent runs wait for each other)."""
    await _run(store, lambda config: command.upgrade(config, revision))


async def downgrade(store: Store, revision: str) -> None:
    """Downgrade the schema to ``revision`` (``"base"`` removes every table)."""
    await _run(store, lambda config: command.downgrade(config, revision))


async def _run(store: Store, operation: Callable[[Config], None]) -> None:
    def run(connection: Connection) -> None:
        config = alembic_config()
        config.attributes["connection"] = connection
        operation(config)

    await store.run_sync_in_transaction(run)
