"""A cheaper insert: no insert trigger, and the job row's rules in one CHECK.

Measured on a one-job enqueue (PostgreSQL 15, `pgbench -M prepared`, one client):

- The statement-level trigger ``jobs_notify_inserted`` (a transition table and a
  PL/pgSQL call per statement) cost about 20 us of the server's CPU; the same
  ``pg_notify`` calls written in agora-pg's insert statements cost about 3 us. A row
  inserted by hand (``INSERT INTO agora.jobs ...`` from another language) is now found
  by the workers' poll (``WORKER_POLL_SECONDS``, 1 s by default), or at once if the
  same transaction runs ``SELECT pg_notify('agora_jobs', '<queue>')``.
- The eleven CHECK constraints cost about 15 us more: PostgreSQL reads and plans each
  constraint's expression again in every statement that writes the table, so their
  cost is paid per statement, not per row. They become one CHECK calling
  ``agora.job_row_is_valid``, which tests the same eleven rules and, on a broken one,
  raises the same ``check_violation`` naming the same constraint as before
  (``jobs_locked_while_processing``, ...). It costs a multi-row insert about 0.5 us a row.

The downgrade puts the trigger and the eleven constraints back.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

# The first rule a row breaks, by the name of the constraint that held it until 0014.
ROW_IS_VALID = """
CREATE FUNCTION agora.job_row_is_valid(
    status text, locked_by text, lease_expires_at timestamptz, started_at timestamptz,
    finished_at timestamptz, delayed boolean, payload jsonb, retry_count integer,
    max_retries integer, lost_count integer, timeout_seconds double precision
) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    broken text;
BEGIN
    broken := CASE
        WHEN status NOT IN ('pending', 'processing', 'done', 'failed', 'cancelled') THEN 'jobs_status_check'
        WHEN (status = 'processing') <> (locked_by IS NOT NULL) THEN 'jobs_locked_while_processing'
        WHEN lease_expires_at IS NOT NULL AND status <> 'processing' THEN 'jobs_lease_while_processing'
        WHEN status = 'processing' AND started_at IS NULL THEN 'jobs_started_while_processing'
        WHEN status IN ('done', 'cancelled') AND finished_at IS NULL THEN 'jobs_finished_at_when_ended'
        WHEN delayed AND status NOT IN ('pending', 'failed') THEN 'jobs_delayed_while_waiting'
        WHEN jsonb_typeof(payload) <> 'object' THEN 'jobs_payload_check'
        WHEN retry_count < 0 THEN 'jobs_retry_count_check'
        WHEN max_retries < 0 THEN 'jobs_max_retries_check'
        WHEN lost_count < 0 THEN 'jobs_lost_count_check'
        WHEN timeout_seconds <= 0 THEN 'jobs_timeout_seconds_check'
    END;
    IF broken IS NOT NULL THEN
        RAISE EXCEPTION 'new row for relation "jobs" violates check constraint "%"', broken
            USING ERRCODE = 'check_violation', CONSTRAINT = broken, SCHEMA = 'agora', TABLE = 'jobs';
    END IF;
    RETURN true;
END
$$
"""
ROW_CHECK = ("agora.job_row_is_valid(status, locked_by, lease_expires_at, started_at, finished_at, delayed, "
             "payload, retry_count, max_retries, lost_count, timeout_seconds)")

# The constraints until 0014 (0001 and 0012), for the downgrade.
CHECKS = {
    "jobs_status_check": "status IN ('pending', 'processing', 'done', 'failed', 'cancelled')",
    "jobs_retry_count_check": "retry_count >= 0",
    "jobs_max_retries_check": "max_retries >= 0",
    "jobs_payload_check": "jsonb_typeof(payload) = 'object'",
    "jobs_lost_count_check": "lost_count >= 0",
    "jobs_timeout_seconds_check": "timeout_seconds > 0",
    "jobs_locked_while_processing": "(status = 'processing') = (locked_by IS NOT NULL)",
    "jobs_lease_while_processing": "lease_expires_at IS NULL OR status = 'processing'",
    "jobs_started_while_processing": "status <> 'processing' OR started_at IS NOT NULL",
    "jobs_finished_at_when_ended": "status NOT IN ('done', 'cancelled') OR finished_at IS NOT NULL",
    "jobs_delayed_while_waiting": "NOT delayed OR status IN ('pending', 'failed')",
}

# 0008's trigger function, for the downgrade.
NOTIFY_INSERTED = """
CREATE FUNCTION agora.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(CASE WHEN delayed THEN 'agora_delayed' ELSE 'agora_jobs' END,
                      CASE WHEN delayed THEN '' ELSE queue END)
    FROM (SELECT DISTINCT queue, delayed FROM inserted_jobs) AS inserted;
    RETURN NULL;
END
$$
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER jobs_notify_inserted ON agora.jobs")
    op.execute("DROP FUNCTION agora.notify_jobs_inserted()")
    op.execute(ROW_IS_VALID)
    # Added NOT VALID (no scan under the exclusive lock), then validated under a lock that
    # lets claims and outcomes go on; the old constraints held every row to the same rules.
    op.execute(f"ALTER TABLE agora.jobs ADD CONSTRAINT jobs_row_check CHECK ({ROW_CHECK}) NOT VALID")
    op.execute("ALTER TABLE agora.jobs VALIDATE CONSTRAINT jobs_row_check")
    for name in CHECKS:
        op.execute(f"ALTER TABLE agora.jobs DROP CONSTRAINT {name}")


def downgrade() -> None:
    for name, condition in CHECKS.items():
        op.execute(f"ALTER TABLE agora.jobs ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
        op.execute(f"ALTER TABLE agora.jobs VALIDATE CONSTRAINT {name}")
    op.execute("ALTER TABLE agora.jobs DROP CONSTRAINT jobs_row_check")
    op.execute("DROP FUNCTION agora.job_row_is_valid")
    op.execute(NOTIFY_INSERTED)
    op.execute(
        "CREATE TRIGGER jobs_notify_inserted AFTER INSERT ON agora.jobs REFERENCING NEW TABLE AS inserted_jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION agora.notify_jobs_inserted()"
    )
