"""Jobs, runs and workers.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

CLAIMABLE = "status = 'pending' OR (status = 'failed' AND retry_count < max_retries)"
ALIVE = (
    "dedup_key IS NOT NULL AND (status IN ('pending', 'processing') "
    "OR (status = 'failed' AND retry_count < max_retries))"
)
TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.execute("CREATE SCHEMA IF NOT EXISTS agora")
    op.create_table(
        "jobs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True, comment="Job id, assigned by the database."),
        sa.Column("name", sa.Text, nullable=False, comment="Human-readable label; not interpreted."),
        sa.Column("kind", sa.Text, nullable=False, comment="Dispatch key: the worker runs HANDLERS[kind]."),
        sa.Column("queue", sa.Text, nullable=False, server_default=sa.text("'default'"), comment="Queue name; workers take jobs from the queues they were started with."),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'pending'"), comment="pending, processing, done, failed or cancelled."),
        sa.Column("payload", postgresql.JSONB, nullable=False, server_default=sa.text("'{}'::jsonb"), comment="Handler arguments, a JSON object."),
        sa.Column("priority", sa.Integer, nullable=False, server_default=sa.text("0"), comment="Higher runs first among due jobs."),
        sa.Column("run_at", TZ, nullable=False, server_default=sa.text("now()"), comment="Not claimed before this time; also the time of the next retry."),
        sa.Column("retry_count", sa.Integer, nullable=False, server_default=sa.text("0"), comment="Failed attempts so far (a lost worker counts as one)."),
        sa.Column("max_retries", sa.Integer, nullable=True, comment="Failed attempts after which the job stays failed; NULL takes the worker's WORKER_MAX_RETRIES."),
        sa.Column("error_message", sa.Text, nullable=True, comment="Type and text of the last error."),
        sa.Column("dedup_key", sa.Text, nullable=True, comment="At most one pending, processing or retrying job per key."),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When the job was enqueued."),
        sa.Column("started_at", TZ, nullable=True, comment="When the latest attempt was claimed."),
        sa.Column("finished_at", TZ, nullable=True, comment="When the latest attempt ended."),
        sa.Column("locked_by", sa.Text, nullable=True, comment="Id of the worker running the job (agora.workers.id)."),
        sa.Column("lease_expires_at", TZ, nullable=True, comment="A processing job whose lease has passed is rescued by another worker."),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("0"), comment="Claim counter and fencing token: completions must name the current attempt."),
        sa.CheckConstraint("status IN ('pending', 'processing', 'done', 'failed', 'cancelled')", name="jobs_status_check"),
        sa.CheckConstraint("retry_count >= 0", name="jobs_retry_count_check"),
        sa.CheckConstraint("max_retries >= 0", name="jobs_max_retries_check"),
        sa.CheckConstraint("jsonb_typeof(payload) = 'object'", name="jobs_payload_check"),
        schema="agora",
        comment="One row per job; workers claim due rows with FOR UPDATE SKIP LOCKED.",
    )
    op.create_index(
        "jobs_claimable_idx",
        "jobs",
        ["queue", sa.text("priority DESC"), "run_at", "id"],
        schema="agora",
        postgresql_where=sa.text(CLAIMABLE),
    )
    op.create_index("jobs_dedup_key_idx", "jobs", ["dedup_key"], unique=True, schema="agora", postgresql_where=sa.text(ALIVE))
    op.create_index("jobs_lease_idx", "jobs", ["lease_expires_at"], schema="agora", postgresql_where=sa.text("status = 'processing'"))

    op.create_table(
        "runs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True, comment="Run id."),
        sa.Column("job_id", sa.BigInteger, sa.ForeignKey("agora.jobs.id", ondelete="CASCADE"), nullable=True, comment="The job this attempt ran, if any."),
        sa.Column("pipeline_id", sa.Text, nullable=True, comment="The scheduled pipeline this run belongs to, if any."),
        sa.Column("attempt", sa.Integer, nullable=False, server_default=sa.text("1"), comment="Which claim of the job this was (agora.jobs.attempt at the time)."),
        sa.Column("worker_id", sa.Text, nullable=True, comment="The worker that ran it (agora.workers.id)."),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When the attempt began."),
        sa.Column("finished_at", TZ, nullable=True, comment="When the attempt ended; NULL while running."),
        sa.Column("status", sa.Text, nullable=False, server_default=sa.text("'running'"), comment="running, succeeded, failed, abandoned (worker lost) or cancelled (released at shutdown)."),
        sa.Column("error_type", sa.Text, nullable=True, comment="Exception class name of a failed attempt."),
        sa.Column("error_message", sa.Text, nullable=True, comment="Type and text of the error."),
        sa.CheckConstraint("status IN ('running', 'succeeded', 'failed', 'abandoned', 'cancelled')", name="runs_status_check"),
        schema="agora",
        comment="One row per execution attempt: job attempts and scheduled-pipeline runs.",
    )
    op.create_index("runs_job_attempt_idx", "runs", ["job_id", "attempt"], unique=True, schema="agora", postgresql_where=sa.text("job_id IS NOT NULL"))
    op.create_index("runs_finished_at_idx", "runs", ["finished_at"], schema="agora")

    op.create_table(
        "workers",
        sa.Column("id", sa.Text, primary_key=True, comment="Unique per process start; never reused."),
        sa.Column("hostname", sa.Text, nullable=False, comment="Host the worker runs on."),
        sa.Column("pid", sa.Integer, nullable=False, comment="Operating-system process id."),
        sa.Column("queues", postgresql.ARRAY(sa.Text), nullable=False, server_default=sa.text("'{default}'::text[]"), comment="Queues the worker takes jobs from."),
        sa.Column("started_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When the worker started."),
        sa.Column("last_heartbeat_at", TZ, nullable=False, server_default=sa.text("now()"), comment="Last sign of life."),
        sa.Column("stopped_at", TZ, nullable=True, comment="When the worker stopped cleanly; NULL while running or after a crash."),
        schema="agora",
        comment="Worker processes and their heartbeats.",
    )

    # Wake idle workers on every insert, whatever inserted the rows (enqueue(),
    # a plain INSERT from psql, a trigger of the caller's). Delivered at commit.
    op.execute(
        """
        CREATE FUNCTION agora.notify_jobs_inserted() RETURNS trigger
        LANGUAGE plpgsql AS $$
        DECLARE
            queue_name text;
        BEGIN
            FOR queue_name IN SELECT DISTINCT queue FROM inserted_jobs LOOP
                PERFORM pg_notify('agora_jobs', queue_name);
            END LOOP;
            RETURN NULL;
        END
        $$
        """
    )
    op.execute(
        """
        CREATE TRIGGER jobs_notify_inserted
        AFTER INSERT ON agora.jobs
        REFERENCING NEW TABLE AS inserted_jobs
        FOR EACH STATEMENT EXECUTE FUNCTION agora.notify_jobs_inserted()
        """
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER IF EXISTS jobs_notify_inserted ON agora.jobs")
    op.execute("DROP FUNCTION IF EXISTS agora.notify_jobs_inserted()")
    op.drop_table("workers", schema="agora")
    op.drop_table("runs", schema="agora")
    op.drop_table("jobs", schema="agora")
