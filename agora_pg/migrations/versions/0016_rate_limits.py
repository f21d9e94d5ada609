"""Rate limits per kind, or per key of a kind: at most ``rate`` starts in any
``rate_seconds``, by the database's clock.

``agora.kind_limits`` gets ``rate`` and ``rate_seconds``, and ``concurrency`` may be
NULL (a kind limited by rate alone). ``agora.kind_starts`` holds one row per start of
a rate-limited kind's job (its kind, its key, when), written by the claim that started
it and deleted once older than the window. ``agora.claim_limited_jobs`` counts, under
the same key locks as the running jobs, each key's starts in the window ending now, and
takes no more than both limits allow. A job held back by a rate limit stays pending:
no attempt is counted.

The downgrade removes the rate-limited kinds' limits (rows without a concurrency),
the columns, the starts table, and puts 0015's claim function back.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

NO_LIMIT = 2147483647  # the free slots of a limit not set

CLAIM_LIMITED_JOBS = rf"""
CREATE OR REPLACE FUNCTION agora.claim_limited_jobs(
    queues text[], kinds text[], scan integer, wanted integer, worker text, lease_seconds double precision
) RETURNS SETOF agora.jobs LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ids bigint[];
    id_kinds text[];
    id_keys text[];
BEGIN
    WITH due AS (
        SELECT best.id, best.kind, best.priority, best.run_at, COALESCE(best.payload->>l.limit_by, '') AS key
        FROM unnest(queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.payload, j.priority, j.run_at FROM agora.jobs AS j
            WHERE (j.status = 'pending' OR (j.status = 'failed' AND j.retry_count < j.max_retries)) AND NOT j.delayed
              AND j.queue = q.name AND j.run_at <= now()
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT scan
        ) AS best
        JOIN agora.kind_limits AS l ON l.kind = best.kind
        WHERE best.kind = ANY(kinds)
    ), free AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT * FROM agora.limit_room(kinds)
    ), fitting AS (
        SELECT d.id, d.kind, d.key FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.priority DESC, d.run_at, d.id) AS rank
            FROM due AS d
        ) AS d
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE d.rank <= COALESCE(f.room, (SELECT LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT}))
                                         FROM agora.kind_limits AS l WHERE l.kind = d.kind))
        ORDER BY d.priority DESC, d.run_at, d.id
        LIMIT wanted
    ), locked AS (
        SELECT keys.kind, keys.key FROM (SELECT DISTINCT fitting.kind, fitting.key FROM fitting) AS keys
        WHERE pg_try_advisory_xact_lock(6383468, hashtext(keys.kind || chr(31) || keys.key))
    )
    SELECT array_agg(fitting.id), array_agg(fitting.kind), array_agg(fitting.key) INTO ids, id_kinds, id_keys
    FROM fitting JOIN locked ON locked.kind = fitting.kind AND locked.key = fitting.key;
    IF ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    -- (the rows are read by id alone and their state tested after: with the state in the
    -- same WHERE, a planner without statistics scans the claim index for the ids)
    WITH due AS (
        SELECT d.id, d.kind, d.key, j.status, j.retry_count, j.max_retries, j.delayed, j.priority, j.run_at
        FROM unnest(ids, id_kinds, id_keys) AS d(id, kind, key)
        CROSS JOIN LATERAL (SELECT * FROM agora.jobs AS j WHERE j.id = d.id OFFSET 0) AS j
    ), free AS MATERIALIZED (
        SELECT * FROM agora.limit_room(id_kinds)
    ), ranked AS (
        SELECT d.id, d.kind, d.key, d.priority, d.run_at,
               COALESCE(f.room, LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT}))) AS room,
               row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.priority DESC, d.run_at, d.id) AS rank
        FROM due AS d
        JOIN agora.kind_limits AS l ON l.kind = d.kind
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE (d.status = 'pending' OR (d.status = 'failed' AND d.retry_count < d.max_retries))
          AND NOT d.delayed AND d.run_at <= now()
    ), chosen AS (
        SELECT j.id, j.status, j.retry_count, j.max_retries, j.delayed, j.run_at FROM agora.jobs AS j
        WHERE j.id = ANY(ARRAY(SELECT ranked.id FROM ranked WHERE ranked.rank <= ranked.room
                               ORDER BY ranked.priority DESC, ranked.run_at, ranked.id LIMIT wanted))
        FOR UPDATE OF j SKIP LOCKED
    ), claimed AS (
        UPDATE agora.jobs AS j
        SET status = 'processing', started_at = now(), finished_at = NULL, locked_by = worker,
            lease_expires_at = CASE WHEN (SELECT w.lease_expires_at FROM agora.workers AS w WHERE w.id = worker) > now()
                                    THEN NULL ELSE now() + make_interval(secs => lease_seconds) END,
            attempt = j.attempt + 1, cancel_requested_at = NULL, progress = NULL
        FROM chosen AS c
        WHERE j.id = c.id  -- (c is the row as locked: its state is the latest)
          AND (c.status = 'pending' OR (c.status = 'failed' AND c.retry_count < c.max_retries)) AND NOT c.delayed
        RETURNING j.*
    ), started AS (
        INSERT INTO agora.kind_starts (kind, key, started_at)
        SELECT c.kind, COALESCE(c.payload->>l.limit_by, ''), now()
        FROM claimed AS c JOIN agora.kind_limits AS l ON l.kind = c.kind
        WHERE l.rate IS NOT NULL
    )
    SELECT * FROM claimed;
    DELETE FROM agora.kind_starts AS s USING agora.kind_limits AS l
    WHERE s.kind = ANY(id_kinds) AND l.kind = s.kind
      AND s.started_at < now() - make_interval(secs => COALESCE(l.rate_seconds, 0));
END
$$
"""

# Each key of the limited kinds $1 that has running jobs or starts in its window: how
# many more of its jobs may start now (the least of both limits' room; a key not listed
# has a whole limit's room).
LIMIT_ROOM = rf"""
CREATE FUNCTION agora.limit_room(kinds text[]) RETURNS TABLE (kind text, key text, room integer)
LANGUAGE sql STABLE AS $$
    WITH running AS (
        SELECT j.kind, COALESCE(j.payload->>l.limit_by, '') AS key, count(*)::integer AS n
        FROM agora.jobs AS j JOIN agora.kind_limits AS l ON l.kind = j.kind
        WHERE j.status = 'processing' AND j.kind = ANY(kinds) AND l.concurrency IS NOT NULL
        GROUP BY 1, 2
    ), started AS (
        SELECT s.kind, s.key, count(*)::integer AS n
        FROM agora.kind_starts AS s JOIN agora.kind_limits AS l ON l.kind = s.kind
        WHERE s.kind = ANY(kinds) AND l.rate IS NOT NULL AND s.started_at > now() - make_interval(secs => l.rate_seconds)
        GROUP BY 1, 2
    )
    SELECT k.kind, k.key,
           LEAST(COALESCE(l.concurrency - COALESCE(r.n, 0), {NO_LIMIT}), COALESCE(l.rate - COALESCE(s.n, 0), {NO_LIMIT}))
    FROM (SELECT running.kind, running.key FROM running UNION SELECT started.kind, started.key FROM started) AS k
    JOIN agora.kind_limits AS l ON l.kind = k.kind
    LEFT JOIN running AS r ON r.kind = k.kind AND r.key = k.key
    LEFT JOIN started AS s ON s.kind = k.kind AND s.key = k.key
$$
"""


def upgrade() -> None:
    op.alter_column("kind_limits", "concurrency", schema="agora", nullable=True,
                    comment="At most this many of the kind's jobs (or of each key's) run at once, across every "
                            "worker; NULL: no concurrency limit.")
    op.add_column("kind_limits", sa.Column("rate", sa.Integer(), nullable=True,
                                           comment="At most this many of the kind's jobs (or of each key's) start "
                                                   "in any rate_seconds; NULL: no rate limit."), schema="agora")
    op.add_column("kind_limits", sa.Column("rate_seconds", sa.Float(), nullable=True,
                                           comment="The window of the rate limit, in seconds."), schema="agora")
    op.create_check_constraint("kind_limits_rate_positive", "kind_limits",
                               "(rate IS NULL) = (rate_seconds IS NULL) AND (rate IS NULL OR (rate > 0 AND rate_seconds > 0))",
                               schema="agora")
    op.create_check_constraint("kind_limits_some_limit", "kind_limits",
                               "concurrency IS NOT NULL OR rate IS NOT NULL", schema="agora")
    op.create_table_comment("kind_limits", "Concurrency and rate limits of job kinds, declared by the workers that "
                            "handle them.", schema="agora")
    op.create_table(
        "kind_starts",
        sa.Column("kind", sa.Text(), nullable=False, comment="The rate-limited kind."),
        sa.Column("key", sa.Text(), nullable=False, comment="The key its limit counted (see kind_limits.limit_by)."),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False, comment="When the claim started the job."),
        schema="agora",
        comment="Starts of rate-limited kinds' jobs within their window (older ones are deleted by the claims).",
    )
    op.create_index("kind_starts_key_idx", "kind_starts", ["kind", "key", "started_at"], schema="agora")
    op.execute(LIMIT_ROOM)
    op.execute(CLAIM_LIMITED_JOBS)


def downgrade() -> None:
    op.execute(migration("0015_kind_limits").CLAIM_LIMITED_JOBS.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1))
    op.execute("DROP FUNCTION agora.limit_room(text[])")
    op.drop_table("kind_starts", schema="agora")
    op.execute("DELETE FROM agora.kind_limits WHERE concurrency IS NULL")
    op.drop_constraint("kind_limits_some_limit", "kind_limits", schema="agora")
    op.drop_constraint("kind_limits_rate_positive", "kind_limits", schema="agora")
    op.drop_column("kind_limits", "rate_seconds", schema="agora")
    op.drop_column("kind_limits", "rate", schema="agora")
    op.create_table_comment("kind_limits", "Concurrency limits of job kinds, declared by the workers that handle them.",
                            schema="agora")
    op.alter_column("kind_limits", "concurrency", schema="agora", nullable=False,
                    comment="At most this many of the kind's jobs (or of each key's) run at once, across every worker.")
