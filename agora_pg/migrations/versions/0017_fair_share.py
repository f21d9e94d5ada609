"""Fair share across the keys of a kind: each job of a keyed kind carries its key, and
the limited claim takes one job per key in turn.

``agora.kind_limits.fair_by`` names the payload field a kind's jobs are shared by (a
kind with ``limit_by`` and no ``fair_by`` is shared by its limit's key). A job of such a
kind stores that field's value in ``agora.jobs.fair_key``, written by the insert itself
(and by a worker that declares the kind, for the jobs already waiting), and
``jobs_fair_idx`` orders the claimable ones by queue and key. ``agora.claim_limited_jobs``
now visits, in each queue, the keys that have due jobs, one index probe per key (a skip
scan), starting after ``after_key`` (the last key the calling worker served) and
wrapping around; it takes the first jobs of each key visited, one per key per turn, so
a key with a million jobs waiting gets one turn in as many as there are keys. Jobs of
limited kinds without a key (a kind limited as a whole, or a row inserted before its
kind was declared) are still read from the head of the queue, as before. Keys are
counted for the limits as before (``limit_by``), and a kind with ``fair_by`` alone takes
no key lock: there is no limit to keep.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

NO_LIMIT = 2147483647  # the free slots of a limit not set
_CLAIMABLE_NOW = ("(j.status = 'pending' OR (j.status = 'failed' AND j.retry_count < j.max_retries)) "
                  "AND NOT j.delayed AND j.run_at <= now()")

CLAIM_LIMITED_JOBS = rf"""
CREATE FUNCTION agora.claim_limited_jobs(
    queues text[], kinds text[], scan integer, wanted integer, worker text, lease_seconds double precision,
    after_key text
) RETURNS SETOF agora.jobs LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ids bigint[];
    id_kinds text[];
    id_keys text[];
    fair_queues text[] := '{{}}';
    fair_keys text[] := '{{}}';
    queue_name text;
    previous text;
    found_key text;
    wrapped boolean;
    key_budget integer := greatest(2 * wanted, 20);  -- keys visited at most (some may be full)
    per_key integer;
BEGIN
    -- The keys with due jobs of these kinds, in key order from after_key, wrapping around.
    IF EXISTS (SELECT FROM agora.kind_limits AS l WHERE l.kind = ANY(kinds) AND COALESCE(l.fair_by, l.limit_by) IS NOT NULL) THEN
        FOREACH queue_name IN ARRAY queues LOOP
            previous := after_key;
            wrapped := after_key IS NULL;
            WHILE cardinality(fair_keys) < key_budget LOOP
                IF previous IS NULL THEN
                    SELECT j.fair_key INTO found_key FROM agora.jobs AS j
                    WHERE {_CLAIMABLE_NOW} AND j.queue = queue_name AND j.fair_key IS NOT NULL AND j.kind = ANY(kinds)
                    ORDER BY j.fair_key LIMIT 1;
                ELSE
                    SELECT j.fair_key INTO found_key FROM agora.jobs AS j
                    WHERE {_CLAIMABLE_NOW} AND j.queue = queue_name AND j.fair_key > previous AND j.kind = ANY(kinds)
                    ORDER BY j.fair_key LIMIT 1;
                END IF;
                IF NOT FOUND THEN
                    EXIT WHEN wrapped;
                    wrapped := true;
                    previous := NULL;
                    CONTINUE;
                END IF;
                EXIT WHEN wrapped AND after_key IS NOT NULL AND found_key > after_key;  -- came round
                fair_queues := fair_queues || queue_name;
                fair_keys := fair_keys || found_key;
                previous := found_key;
            END LOOP;
        END LOOP;
    END IF;
    per_key := greatest(1, ceil(wanted::numeric / greatest(cardinality(fair_keys), 1))::integer);

    WITH headed AS (  -- jobs without a key: the first of each queue, in claim order
        SELECT best.id, best.kind, best.payload, best.priority, best.run_at,
               row_number() OVER (ORDER BY best.priority DESC, best.run_at, best.id) AS turn
        FROM unnest(queues) AS q(name)
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.payload, j.priority, j.run_at, j.fair_key FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = q.name
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT scan
        ) AS best
        WHERE best.kind = ANY(kinds) AND best.fair_key IS NULL
    ), keyed AS (  -- the first jobs of each key visited: turn n takes each key's n-th job
        SELECT best.id, best.kind, best.payload, best.priority, best.run_at,
               (best.rank - 1) * cardinality(fair_keys) + v.position AS turn
        FROM unnest(fair_queues, fair_keys) WITH ORDINALITY AS v(queue, fair_key, position)
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.payload, j.priority, j.run_at,
                   row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS rank
            FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = v.queue AND j.fair_key = v.fair_key AND j.kind = ANY(kinds)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT per_key
        ) AS best
    ), due AS (
        SELECT d.id, d.kind, d.priority, d.run_at, d.turn, COALESCE(d.payload->>l.limit_by, '') AS key,
               (l.concurrency IS NOT NULL OR l.rate IS NOT NULL) AS counted
        FROM (SELECT * FROM headed UNION ALL SELECT * FROM keyed) AS d
        JOIN agora.kind_limits AS l ON l.kind = d.kind
    ), free AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT * FROM agora.limit_room(kinds)
    ), fitting AS (
        SELECT d.id, d.kind, d.key, d.counted FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.turn, d.priority DESC, d.run_at, d.id) AS rank
            FROM due AS d
        ) AS d
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE d.rank <= COALESCE(f.room, (SELECT LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT}))
                                         FROM agora.kind_limits AS l WHERE l.kind = d.kind))
        ORDER BY d.turn, d.priority DESC, d.run_at, d.id
        LIMIT wanted
    ), locked AS (  -- (a kind without a limit, shared by key alone, needs no lock)
        SELECT keys.kind, keys.key FROM (SELECT DISTINCT fitting.kind, fitting.key, fitting.counted FROM fitting) AS keys
        WHERE NOT keys.counted OR pg_try_advisory_xact_lock(6383468, hashtext(keys.kind || chr(31) || keys.key))
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
        WHERE j.id = ANY(ARRAY(SELECT ranked.id FROM ranked WHERE ranked.rank <= ranked.room))
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

_CLAIMABLE = "(status = 'pending' OR (status = 'failed' AND retry_count < max_retries))"


def upgrade() -> None:
    op.add_column("kind_limits", sa.Column(
        "fair_by", sa.Text(), nullable=True,
        comment="Payload field whose value is the key the kind's jobs are shared by, one per key in turn; "
                "NULL: limit_by's key, if any."), schema="agora")
    op.create_check_constraint("kind_limits_fair_by_not_empty", "kind_limits", "fair_by IS NULL OR fair_by <> ''",
                               schema="agora")
    op.drop_constraint("kind_limits_some_limit", "kind_limits", schema="agora")
    op.create_check_constraint("kind_limits_some_limit", "kind_limits",
                               "concurrency IS NOT NULL OR rate IS NOT NULL OR fair_by IS NOT NULL", schema="agora")
    op.create_table_comment("kind_limits", "Flow control of job kinds (concurrency and rate limits, fair share), "
                            "declared by the workers that handle them.", schema="agora")
    op.add_column("jobs", sa.Column(
        # (byte order: the key visits of the claim and the worker's cursor, in Python, agree)
        "fair_key", sa.Text(collation="C"), nullable=True,
        comment="The job's key for fair share (its kind's fair_by, else limit_by, payload field), written at "
                "insert; NULL: its kind has none."), schema="agora")
    op.create_index("jobs_fair_idx", "jobs", ["queue", "fair_key", sa.text("priority DESC"), "run_at", "id"],
                    schema="agora",
                    postgresql_where=sa.text(f"{_CLAIMABLE} AND NOT delayed AND fair_key IS NOT NULL"))
    op.execute("DROP FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, double precision)")
    op.execute(CLAIM_LIMITED_JOBS)


def downgrade() -> None:
    op.execute("DROP FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, double precision, text)")
    op.execute(migration("0016_rate_limits").CLAIM_LIMITED_JOBS.replace("CREATE OR REPLACE FUNCTION", "CREATE FUNCTION", 1))
    op.drop_index("jobs_fair_idx", table_name="jobs", schema="agora")
    op.drop_column("jobs", "fair_key", schema="agora")
    op.execute("DELETE FROM agora.kind_limits WHERE concurrency IS NULL AND rate IS NULL")
    op.drop_constraint("kind_limits_some_limit", "kind_limits", schema="agora")
    op.create_check_constraint("kind_limits_some_limit", "kind_limits", "concurrency IS NOT NULL OR rate IS NOT NULL",
                               schema="agora")
    op.drop_constraint("kind_limits_fair_by_not_empty", "kind_limits", schema="agora")
    op.drop_column("kind_limits", "fair_by", schema="agora")
    op.create_table_comment("kind_limits", "Concurrency and rate limits of job kinds, declared by the workers that "
                            "handle them.", schema="agora")
