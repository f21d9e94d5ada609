"""Concurrency limits per kind, or per key of a kind: ``agora.kind_limits``.

One row per limited kind: at most ``concurrency`` of its jobs run at once across every
worker, counted per value of the payload field ``limit_by`` when it is set (NULL: the
kind as a whole). Workers write the rows of the kinds they handle when they start
(``Handlers.kind(..., concurrency=..., limit_by=...)``); the claims read them. Plain
claims leave limited kinds alone; a worker takes them with
``agora.claim_limited_jobs``, which counts the running jobs of each key under a lock of
that key, so no limit is overshot. A slot is free again when the job leaves
``processing`` (its outcome, its rescue, its release): nothing is counted apart from the
jobs' own rows.

``agora.claim_limited_jobs`` is one statement for the client (one round trip) with two
steps inside. The first reads the first ``scan`` due jobs of each of ``queues`` in
claim order, whatever their kind (so the read stays bounded however many jobs of other
kinds wait), and keeps those of the limited ``kinds``, each with its key: its kind's
``limit_by`` field's value, or '' for a kind limited as a whole or a payload without
the field. It counts each key's running jobs, keeps the jobs that fit each key's free
slots (at most ``wanted``) and takes a transaction-scoped advisory lock on each of
their keys, skipping keys another claim holds. The second runs with a snapshot taken
after those locks were granted (a PL/pgSQL statement in READ COMMITTED takes its own),
so it sees every claim of those keys that committed: it counts each key's running
jobs again and claims, in claim order, the jobs that still fit. The lease is the
claim's (see ``queries._JOB_LEASE``).

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


CLAIM_LIMITED_JOBS = r"""
CREATE FUNCTION agora.claim_limited_jobs(
    queues text[], kinds text[], scan integer, wanted integer, worker text, lease_seconds double precision
) RETURNS SETOF agora.jobs LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    ids bigint[];
    id_kinds text[];
    id_keys text[];
BEGIN
    WITH due AS (
        SELECT best.id, best.kind, best.priority, best.run_at, COALESCE(best.payload->>l.limit_by, '') AS key,
               l.concurrency
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
    ), running AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT j.kind, COALESCE(j.payload->>l.limit_by, '') AS key, count(*) AS n
        FROM agora.jobs AS j JOIN agora.kind_limits AS l ON l.kind = j.kind
        WHERE j.status = 'processing' AND j.kind = ANY(kinds)
        GROUP BY 1, 2
    ), fitting AS (
        SELECT d.id, d.kind, d.key FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.priority DESC, d.run_at, d.id) AS rank
            FROM due AS d
        ) AS d
        LEFT JOIN running AS r ON r.kind = d.kind AND r.key = d.key
        WHERE d.rank <= d.concurrency - COALESCE(r.n, 0)
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
    ), running AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT j.kind, COALESCE(j.payload->>l.limit_by, '') AS key, count(*) AS n
        FROM agora.jobs AS j JOIN agora.kind_limits AS l ON l.kind = j.kind
        WHERE j.status = 'processing' AND j.kind = ANY(id_kinds)
        GROUP BY 1, 2
    ), ranked AS (
        SELECT d.id, d.priority, d.run_at, l.concurrency - COALESCE(r.n, 0) AS free,
               row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.priority DESC, d.run_at, d.id) AS rank
        FROM due AS d
        JOIN agora.kind_limits AS l ON l.kind = d.kind
        LEFT JOIN running AS r ON r.kind = d.kind AND r.key = d.key
        WHERE (d.status = 'pending' OR (d.status = 'failed' AND d.retry_count < d.max_retries))
          AND NOT d.delayed AND d.run_at <= now()
    ), chosen AS (
        SELECT j.id, j.status, j.retry_count, j.max_retries, j.delayed, j.run_at FROM agora.jobs AS j
        WHERE j.id = ANY(ARRAY(SELECT ranked.id FROM ranked WHERE ranked.rank <= ranked.free
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
    )
    SELECT * FROM claimed;
END
$$
"""


def upgrade() -> None:
    op.create_table(
        "kind_limits",
        sa.Column("kind", sa.Text(), primary_key=True, comment="The job kind limited."),
        sa.Column("concurrency", sa.Integer(), nullable=False,
                  comment="At most this many of the kind's jobs (or of each key's) run at once, across every worker."),
        sa.Column("limit_by", sa.Text(), nullable=True,
                  comment="Payload field whose value is the key each limit counts apart; NULL: the kind as a whole."),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
                  comment="When a worker last declared the limit."),
        sa.CheckConstraint("concurrency > 0", name="kind_limits_concurrency_positive"),
        sa.CheckConstraint("limit_by IS NULL OR limit_by <> ''", name="kind_limits_limit_by_not_empty"),
        schema="agora",
        comment="Concurrency limits of job kinds, declared by the workers that handle them.",
    )
    op.execute(CLAIM_LIMITED_JOBS)


def downgrade() -> None:
    op.execute("DROP FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, double precision)")
    op.drop_table("kind_limits", schema="agora")
