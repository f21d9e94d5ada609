"""Jobs waiting for their run_at (delayed, or backing off before a retry) are kept out
of the claim index until a worker promotes them, so that future rows never slow a claim.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

CLAIMABLE = "status = 'pending' OR (status = 'failed' AND retry_count < max_retries)"
CLAIMABLE_COLUMNS: list[str | sa.TextClause] = ["queue", sa.text("priority DESC"), "run_at", "id"]

DELAYED_COMMENT = (
    "The job waits for its run_at (enqueued for later, or backing off before a retry): it is "
    "outside the claim index until a worker's promotion clears this once run_at has passed."
)

# Wake workers only for jobs they can claim now; a statement that inserted delayed jobs
# wakes the workers' promotion step instead (payload ''), which sleeps until the earliest.
NOTIFY_INSERTED = """
CREATE OR REPLACE FUNCTION agora.notify_jobs_inserted() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    queue_name text;
BEGIN
    FOR queue_name IN SELECT DISTINCT queue FROM inserted_jobs WHERE NOT delayed LOOP
        PERFORM pg_notify('agora_jobs', queue_name);
    END LOOP;
    IF EXISTS (SELECT 1 FROM inserted_jobs WHERE delayed) THEN
        PERFORM pg_notify('agora_delayed', '');
    END IF;
    RETURN NULL;
END
$$
"""

NOTIFY_INSERTED_BEFORE = """
CREATE OR REPLACE FUNCTION agora.notify_jobs_inserted() RETURNS trigger
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


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("delayed", sa.Boolean, nullable=False, server_default=sa.text("false"), comment=DELAYED_COMMENT),
        schema="agora",
    )
    op.execute(f"UPDATE agora.jobs SET delayed = true WHERE run_at > now() AND ({CLAIMABLE})")
    op.drop_index("jobs_claimable_idx", table_name="jobs", schema="agora")
    op.create_index("jobs_claimable_idx", "jobs", CLAIMABLE_COLUMNS, schema="agora",
                    postgresql_where=sa.text(f"({CLAIMABLE}) AND NOT delayed"))
    op.create_index("jobs_delayed_idx", "jobs", ["run_at"], schema="agora", postgresql_where=sa.text("delayed"))
    op.execute(NOTIFY_INSERTED)


def downgrade() -> None:
    op.execute(NOTIFY_INSERTED_BEFORE)
    op.drop_index("jobs_delayed_idx", table_name="jobs", schema="agora")
    op.drop_index("jobs_claimable_idx", table_name="jobs", schema="agora")
    op.create_index("jobs_claimable_idx", "jobs", CLAIMABLE_COLUMNS, schema="agora",
                    postgresql_where=sa.text(CLAIMABLE))
    op.drop_column("jobs", "delayed", schema="agora")
