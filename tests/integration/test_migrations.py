"""The migrations migrate both ways, and leave a schema the code can use."""

import asyncio

import asyncpg
import pytest

from agora_pg.db import migrate
from agora_pg.db.connect import Database
from agora_pg.db.store import Store
from agora_pg.jobs import JOB_FIELDS


async def schema_of(store: Store) -> list[tuple[str, str, str]]:
    """Every column, index, constraint and function of the agora schema, as the catalog
    describes them: the same after a downgrade and an upgrade again as after the first."""
    rows = await store.fetch("""
        SELECT 'column' AS what, table_name || '.' || column_name AS name,
               concat_ws(' ', data_type, is_nullable, column_default, col_description(
                   ('agora.' || table_name)::regclass, ordinal_position::int)) AS definition
        FROM information_schema.columns WHERE table_schema = 'agora'
        UNION ALL SELECT 'index', indexname, indexdef FROM pg_indexes WHERE schemaname = 'agora'
        UNION ALL SELECT 'constraint', conrelid::regclass::text || '.' || conname, pg_get_constraintdef(oid)
        FROM pg_constraint WHERE connamespace = 'agora'::regnamespace
        UNION ALL SELECT 'function', oid::regprocedure::text, md5(pg_get_functiondef(oid))
        FROM pg_proc WHERE pronamespace = 'agora'::regnamespace
        ORDER BY 1, 2""")
    return [(row["what"], row["name"], row["definition"]) for row in rows]


async def test_upgrade_to_head_is_idempotent_and_has_every_job_field(fresh_db: str) -> None:
    store = Store.open(Database(fresh_db))
    try:
        assert await store.schema_versions() == set()
        await migrate.upgrade(store)
        await migrate.upgrade(store)
        assert await store.schema_versions() == migrate.head_revisions()
        columns = {row["column_name"] for row in await store.fetch(
            "SELECT column_name FROM information_schema.columns WHERE table_schema = 'agora' AND table_name = 'jobs'")}
        assert set(JOB_FIELDS) <= columns
    finally:
        await store.close()


async def test_downgrade_to_base_then_upgrade_again(fresh_db: str) -> None:
    store = Store.open(Database(fresh_db))
    try:
        await migrate.upgrade(store)
        head = await schema_of(store)
        await migrate.downgrade(store, "base")
        async with store.connection() as connection:
            tables = await connection.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'agora' AND tablename <> 'alembic_version'"
            )
        assert tables == 0
        await migrate.upgrade(store)
        assert await store.schema_versions() == migrate.head_revisions()
        assert await schema_of(store) == head
    finally:
        await store.close()


async def test_every_column_is_commented(store: Store) -> None:
    async with store.connection() as connection:
        missing = await connection.fetch(
            """
            SELECT c.table_name, c.column_name FROM information_schema.columns c
            WHERE c.table_schema = 'agora' AND c.table_name IN ('jobs', 'runs', 'workers', 'schedules')
              AND col_description(format('agora.%I', c.table_name)::regclass, c.ordinal_position) IS NULL
            """
        )
    assert [tuple(row) for row in missing] == []


async def test_upgrade_to_delayed_jobs_marks_the_waiting_rows_and_downgrades(fresh_db: str) -> None:
    store = Store.open(Database(fresh_db))
    try:
        await migrate.upgrade(store, "0005")
        async with store.connection() as connection:
            await connection.execute(
                "INSERT INTO agora.jobs (name, kind, run_at) VALUES ('later', 'k', now() + interval '1 hour'), "
                "('now', 'k', now()), ('gone', 'k', now() + interval '1 hour')"
            )
            await connection.execute("UPDATE agora.jobs SET status = 'done' WHERE name = 'gone'")
        await migrate.upgrade(store)
        async with store.connection() as connection:
            flags = dict(await connection.fetch("SELECT name, delayed FROM agora.jobs"))
        assert flags == {"later": True, "now": False, "gone": False}
        await migrate.downgrade(store, "0005")
        async with store.connection() as connection:
            columns = await connection.fetchval(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'agora' "
                "AND table_name = 'jobs' AND column_name = 'delayed'"
            )
            predicate = await connection.fetchval(
                "SELECT pg_get_expr(indpred, indrelid) FROM pg_index "
                "WHERE indexrelid = 'agora.jobs_claimable_idx'::regclass"
            )
        assert columns == 0 and "delayed" not in predicate
    finally:
        await store.close()


async def test_downgrade_from_worker_leases_gives_running_jobs_a_lease_of_their_own(fresh_db: str) -> None:
    """Earlier versions renew each job's own lease: jobs under a worker lease must get one."""
    store = Store.open(Database(fresh_db))
    try:
        await migrate.upgrade(store)
        await store.workers.register("w", "host", 1, ["default"])
        await store.workers.renew_leases("w", 30, [])
        async with store.connection() as connection:
            await connection.execute(
                "INSERT INTO agora.jobs (name, kind, status, locked_by, attempt, started_at) VALUES "
                "('covered', 'k', 'processing', 'w', 1, now()), ('orphan', 'k', 'processing', 'nobody', 1, now())"
            )
            worker_lease = await connection.fetchval("SELECT lease_expires_at FROM agora.workers WHERE id = 'w'")
        await migrate.downgrade(store, "0008")
        async with store.connection() as connection:
            leases = dict(await connection.fetch("SELECT name, lease_expires_at FROM agora.jobs"))
            predicate = await connection.fetchval(
                "SELECT pg_get_expr(indpred, indrelid) FROM pg_index WHERE indexrelid = 'agora.jobs_lease_idx'::regclass"
            )
        assert leases["covered"] == worker_lease and leases["orphan"] is not None  # (the orphan's: now)
        assert "IS NOT NULL" not in predicate
        await migrate.upgrade(store)
    finally:
        await store.close()


async def test_deleting_jobs_deletes_their_runs_and_nothing_else(store: Store) -> None:
    """Migration 0011 dropped ``runs.job_id``'s foreign key; its triggers still delete a
    job's runs with the job (as ON DELETE CASCADE did) and after a TRUNCATE."""
    async with store.connection() as connection:
        ids = await connection.fetchval(
            "WITH j AS (INSERT INTO agora.jobs (name, kind, status, finished_at) SELECT 'j' || i, 'k', 'done', now() "
            "FROM generate_series(1, 3) AS i RETURNING id) SELECT array_agg(id ORDER BY id) FROM j"
        )
        await connection.execute(
            "INSERT INTO agora.runs (job_id, attempt, status, finished_at) "
            "SELECT id, attempt, 'failed', now() FROM unnest($1::bigint[]) AS id, generate_series(1, 2) AS attempt",
            ids,
        )
        await connection.execute(
            "INSERT INTO agora.runs (pipeline_id, status, scheduled_for) VALUES ('p', 'succeeded', now())"
        )
        await connection.execute("DELETE FROM agora.jobs WHERE id = ANY($1::bigint[])", ids[:2])
        left = await connection.fetch("SELECT job_id, pipeline_id FROM agora.runs ORDER BY job_id NULLS LAST, attempt")
        assert [tuple(row) for row in left] == [(ids[2], None), (ids[2], None), (None, "p")]
        await connection.execute("TRUNCATE agora.jobs")
        left = await connection.fetch("SELECT job_id, pipeline_id FROM agora.runs")
        assert [tuple(row) for row in left] == [(None, "p")]


async def test_downgrade_to_the_foreign_key_never_deletes_history(fresh_db: str) -> None:
    """Going back below 0011 restores the foreign key; a run of no job (possible since)
    is kept, and the key then checks only new rows."""
    store = Store.open(Database(fresh_db))
    try:
        await migrate.upgrade(store)
        head = await schema_of(store)
        validated = "SELECT convalidated FROM pg_constraint WHERE conname = 'runs_job_id_fkey'"
        await migrate.downgrade(store, "0010")
        async with store.connection() as connection:
            assert await connection.fetchval(validated) is True
        await migrate.upgrade(store)
        async with store.connection() as connection:
            assert await connection.fetchval(validated) is None
            await connection.execute("INSERT INTO agora.runs (job_id, status) VALUES (424242, 'succeeded')")
        await migrate.downgrade(store, "0010")
        async with store.connection() as connection:
            assert await connection.fetchval(validated) is False
            assert await connection.fetchval("SELECT count(*) FROM agora.runs WHERE job_id = 424242") == 1
        await migrate.upgrade(store)
        assert await schema_of(store) == head
    finally:
        await store.close()


@pytest.mark.parametrize(("change", "constraint"), [
    ("status = 'processing', started_at = now()", "jobs_locked_while_processing"),
    ("locked_by = 'w1'", "jobs_locked_while_processing"),
    ("lease_expires_at = now()", "jobs_lease_while_processing"),
    ("status = 'processing', locked_by = 'w1', started_at = NULL", "jobs_started_while_processing"),
    ("status = 'done', finished_at = NULL", "jobs_finished_at_when_ended"),
    ("status = 'cancelled', finished_at = NULL", "jobs_finished_at_when_ended"),
    ("status = 'done', finished_at = now(), delayed = true", "jobs_delayed_while_waiting"),
    # the single-column rules, in the same one CHECK since migration 0014
    ("status = 'bogus'", "jobs_status_check"),
    ("payload = '[1]'", "jobs_payload_check"),
    ("retry_count = -1", "jobs_retry_count_check"),
    ("max_retries = -1", "jobs_max_retries_check"),
    ("lost_count = -1", "jobs_lost_count_check"),
    ("timeout_seconds = 0", "jobs_timeout_seconds_check"),
])
async def test_the_database_refuses_a_job_whose_columns_contradict_its_status(
    store: Store, change: str, constraint: str
) -> None:
    async with store.connection() as connection:
        job_id = await connection.fetchval("INSERT INTO agora.jobs (name, kind) VALUES ('n', 'k') RETURNING id")
        with pytest.raises(asyncpg.CheckViolationError) as refused:
            await connection.execute(f"UPDATE agora.jobs SET {change} WHERE id = $1", job_id)
    assert refused.value.constraint_name == constraint


async def test_downgrade_from_the_one_row_check_restores_the_trigger_and_the_eleven_checks(fresh_db: str) -> None:
    store = Store.open(Database(fresh_db))
    checks = "SELECT count(*) FROM pg_constraint WHERE conrelid = 'agora.jobs'::regclass AND contype = 'c'"
    try:
        await migrate.upgrade(store)
        head = await schema_of(store)
        await migrate.downgrade(store, "0013")
        async with store.connection() as connection:
            assert await connection.fetchval(checks) == 11
            listener = await asyncpg.connect(fresh_db)
            woken: asyncio.Queue[str] = asyncio.Queue()
            await listener.add_listener("agora_jobs", lambda *args: woken.put_nowait(args[3]))
            try:
                await connection.execute("INSERT INTO agora.jobs (name, kind, queue) VALUES ('n', 'k', 'q1')")
                assert await asyncio.wait_for(woken.get(), 10) == "q1"  # the trigger is back
            finally:
                await listener.close()
        await migrate.upgrade(store)
        async with store.connection() as connection:
            assert await connection.fetchval(checks) == 1
        assert await schema_of(store) == head
    finally:
        await store.close()


async def test_every_job_state_the_worker_writes_passes_the_checks(store: Store) -> None:
    async with store.connection() as connection:
        await connection.execute(
            "INSERT INTO agora.jobs (name, kind, status, locked_by, started_at, lease_expires_at) "
            "VALUES ('running', 'k', 'processing', 'w1', now(), now() + interval '30 seconds')"
        )
        await connection.execute(
            "INSERT INTO agora.jobs (name, kind, status, finished_at, delayed, run_at, retry_count) "
            "VALUES ('waiting for its retry', 'k', 'failed', now(), true, now() + interval '1 minute', 1)"
        )
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs") == 2
