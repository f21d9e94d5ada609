"""A session of agora-pg's left idle inside a transaction (its process frozen or cut off
in the middle of a claim) is ended by the server, so its locks go with it."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.errors import ConnectionLost
from agora_pg.settings import Settings


async def test_a_transaction_left_idle_loses_its_locks_to_the_servers_timeout(database_url: str) -> None:
    frozen = Store.open(Database(database_url, idle_transaction_timeout=0.5))
    other = await asyncpg.connect(database_url)
    try:
        with pytest.raises(ConnectionLost):
            async with frozen.connection() as connection, connection.transaction():
                await connection.execute("SELECT pg_advisory_xact_lock(42)")
                await connection.fetchval("SELECT 1 FROM agora.workers FOR UPDATE")
                await asyncio.sleep(1.5)  # frozen: the server ends the session meanwhile
                await connection.fetchval("SELECT 1")
        started = time.monotonic()
        assert await other.fetchval("SELECT pg_try_advisory_lock(42)")  # free: no wait
        assert time.monotonic() - started < 1
    finally:
        await other.close()
        await frozen.close()


async def test_the_timeout_is_the_settings_and_never_more_than_half_a_lease(database_url: str) -> None:
    cases = [(Settings(), "10s"), (Settings(idle_transaction_timeout=3), "3s"),
             (Settings(lease_seconds=4), "2s")]
    for settings, shown in cases:
        store = Store.open(Database.from_settings(settings, database_url))
        try:
            async with store.connection() as connection:
                assert await connection.fetchval("SHOW idle_in_transaction_session_timeout") == shown
        finally:
            await store.close()
    pooled = Store.open(Database(database_url, transaction_pooling=True))
    try:
        async with pooled.connection() as connection:  # (a transaction pooler has its own)
            assert await connection.fetchval("SHOW idle_in_transaction_session_timeout") == "0"
    finally:
        await pooled.close()
