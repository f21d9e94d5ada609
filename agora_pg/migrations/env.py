"""Alembic environment for the agora schema.

``agora-pg migrate`` passes an open connection in ``config.attributes``; the
plain ``alembic`` command resolves the database like every agora-pg command.
"""

from __future__ import annotations

import asyncio
import logging
from logging.config import fileConfig

from alembic import context
from sqlalchemy import text
from sqlalchemy.engine import Connection


log = logging.getLogger("alembic.agora_pg")

SCHEMA = "agora"  # every table is in it; the migrations are the schema's one description

# Serialises concurrent `migrate` runs (several containers starting at once).
MIGRATION_LOCK_KEY = 0x61676F7261  # "agora"


def _run(connection: Connection) -> None:
    connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
    connection.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
    context.configure(
        connection=connection,
        version_table_schema=SCHEMA,
        transaction_per_migration=False,
    )
    with context.begin_transaction():
        context.run_migrations()


async def _run_standalone() -> None:
    """``alembic upgrade ...`` from a shell: log what is applied (the ini's loggers), and
    one line instead of a traceback when the database cannot be reached."""
    from agora_pg.db.connect import resolve_database
    from agora_pg.errors import AgoraError

    try:
        async with resolve_database() as database:
            engine = database.create_engine()
            try:
                connection = engine.connect()
                try:
                    await connection.start()
                except Exception as error:  # a wrong URL, a server down, a refused login
                    reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
                    raise SystemExit(f"alembic: cannot connect to {database.display_url}: {reason}") from None
                try:
                    await connection.run_sync(_run)
                    await connection.commit()
                    versions = (await connection.execute(text(f"SELECT version_num FROM {SCHEMA}.alembic_version"))).scalars()
                    log.info("database %s is at revision %s", database.display_url, ", ".join(sorted(versions)))
                finally:
                    await connection.close()
            finally:
                await engine.dispose()
    except AgoraError as error:  # a malformed URL, the embedded server missing
        raise SystemExit(f"alembic: {error}") from None


if context.is_offline_mode():
    raise SystemExit("agora-pg migrations run online only: use `agora-pg migrate`")

_connection = context.config.attributes.get("connection")
if _connection is not None:
    _run(_connection)
else:
    if context.config.config_file_name is not None:
        fileConfig(context.config.config_file_name, disable_existing_loggers=False)
    asyncio.run(_run_standalone())
