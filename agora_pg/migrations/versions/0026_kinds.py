"""Kind options live in the database: ``agora.kinds`` has one row per kind, the options
its workers declared (queue, max_retries, timeout, retry backoff; the latest declaration
wins), and ``agora.workers.kind_options`` what each worker declared, so that two live
workers that disagree show. Every producer applies the row at enqueue: agora-pg's
inserts, and ``agora.enqueue()`` for plain SQL.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

# (agora_pg.db.queries.ALIVE and queries._WAKE at this revision)
ENQUEUE = """
CREATE FUNCTION agora.enqueue(kind text, payload jsonb DEFAULT '{}', queue text DEFAULT NULL,
                              run_at timestamptz DEFAULT NULL, priority integer DEFAULT 0,
                              dedup_key text DEFAULT NULL) RETURNS bigint
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    new_id bigint;
    new_queue text;
    is_delayed boolean;
BEGIN
    IF enqueue.queue LIKE 'agora:%' THEN
        RAISE EXCEPTION 'queue names beginning ''agora:'' are agora-pg''s own (its scheduler''s runs), got %',
            enqueue.queue USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO agora.jobs AS j (name, kind, queue, payload, priority, run_at, max_retries, timeout_seconds,
                                 dedup_key, delayed, fair_key)
    SELECT enqueue.kind, enqueue.kind, COALESCE(enqueue.queue, k.queue, 'default'), enqueue.payload,
           enqueue.priority, COALESCE(enqueue.run_at, now()), k.max_retries, k.timeout_seconds, enqueue.dedup_key,
           COALESCE(enqueue.run_at, now()) > now(),
           (SELECT enqueue.payload ->> COALESCE(l.fair_by, l.limit_by) FROM agora.kind_limits AS l
            WHERE l.kind = enqueue.kind)
    FROM (SELECT) AS one LEFT JOIN agora.kinds AS k ON k.kind = enqueue.kind
    ON CONFLICT (dedup_key) WHERE dedup_key IS NOT NULL AND (status IN ('pending', 'processing')
        OR (status = 'failed' AND retry_count < max_retries)) DO NOTHING
    RETURNING j.id, j.queue, j.delayed INTO new_id, new_queue, is_delayed;
    IF new_id IS NOT NULL THEN
        PERFORM pg_notify(CASE WHEN is_delayed THEN 'agora_delayed' ELSE 'agora_jobs' END,
                          CASE WHEN is_delayed THEN '' ELSE new_queue END);
    END IF;
    RETURN new_id;
END
$$
"""
ENQUEUE_COMMENT = ("Enqueue a job of kind with the options declared for it (agora.kinds): its queue unless "
                   "queue is given, its max_retries and timeout; returns the job id, NULL when dedup_key is "
                   "held by a live job.")


def upgrade() -> None:
    op.create_table(
        "kinds",
        sa.Column("kind", sa.Text(), primary_key=True, comment="The job kind."),
        sa.Column("queue", sa.Text(), nullable=True,
                  comment="The queue a job of the kind goes to when its enqueue names none; NULL: 'default'."),
        sa.Column("max_retries", sa.Integer(), nullable=True,
                  comment="Failed attempts after which its jobs stay failed; NULL: the worker's WORKER_MAX_RETRIES."),
        sa.Column("timeout_seconds", sa.Float(), nullable=True,
                  comment="Seconds an attempt may run; NULL: the worker's WORKER_JOB_TIMEOUT."),
        sa.Column("retry_backoff_seconds", sa.Float(), nullable=True,
                  comment="Base of the retry delay; NULL: the worker's WORKER_RETRY_BACKOFF_SECONDS."),
        sa.Column("declared_by", sa.Text(), nullable=False,
                  comment="The worker whose declaration this is (agora.workers.id): the latest to start wins."),
        sa.Column("declared_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
                  comment="When it was declared."),
        schema="agora",
        comment="Each kind's options, as its workers declare them; every producer applies them at enqueue.",
    )
    op.add_column("workers", sa.Column("kind_options", JSONB(), nullable=True,
                                       comment="The options this worker declared for each of its kinds "
                                               "({kind: {queue, max_retries, timeout_seconds, "
                                               "retry_backoff_seconds}}); NULL: none."), schema="agora")
    op.execute(ENQUEUE)
    op.execute(f"COMMENT ON FUNCTION agora.enqueue(text, jsonb, text, timestamptz, integer, text) IS "
               f"'{ENQUEUE_COMMENT}'")  # (a constant: DDL takes no parameters)


def downgrade() -> None:
    op.execute("DROP FUNCTION agora.enqueue(text, jsonb, text, timestamptz, integer, text)")
    op.drop_column("workers", "kind_options", schema="agora")
    op.drop_table("kinds", schema="agora")
