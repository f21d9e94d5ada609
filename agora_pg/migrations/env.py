"""Alembic environment for the agora schema.

``agora-pg migrate`` passes an open connection in ``config.attributes``; the
plain ``alembic`` command resolves the database like every agora-pg command.
"""

from __future__ import annotations

import asyncio

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection

from agora_pg.db.tables import SCHEMA, metadata

# Serialises concurrent `migrate` runs (several containers starting at once).
MIGRATION_LOCK_KEY = 0x61676F7261  # "agora"


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    if type_ == "schema":
        return name == SCHEMA
    return True


def _run(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    context.configure(
        connection=connection,
        target_metadata=metadata,
        version_table_schema=SCHEMA,
        include_schemas=True,
        include_name=_include_name,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_standalone() -> None:
    from agora_pg.db.connect import resolve_database

    async with resolve_database() as database:
        engine = database.create_engine()
        try:
            async with engine.begin() as connection:
                await connection.run_sync(_run)
        finally:
            await engine.dispose()


if context.is_offline_mode():
    raise SystemExit("agora-pg migrations run online only: use `agora-pg migrate`")

_connection = context.config.attributes.get("connection")
if _connection is not None:
    _run(_connection)
else:
    asyncio.run(_run_standalone())
