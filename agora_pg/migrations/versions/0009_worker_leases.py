"""A lease per worker instead of one per running job: the lease supervisor's renewal
writes the worker's row and only reads its jobs (a non-HOT update of every running job
every 10 s before).

- ``agora.workers.lease_expires_at``: until when the worker's running jobs are its own.
  A job claimed under a live worker lease leaves ``agora.jobs.lease_expires_at`` NULL,
  which an older rescuer (``lease_expires_at < now()``) never matches.
- ``jobs_locked_by_idx``: a worker's running jobs (the renewal reads them, the rescue
  takes them from a worker whose lease passed).
- ``jobs_lease_idx`` now holds only jobs with a lease of their own (claimed by a worker
  without a worker lease, such as a worker of an earlier version).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


JOB_LEASE_COMMENT = (
    "A lease of the job's own (claimed by a worker without a worker lease, such as one of an earlier version): "
    "once passed, another worker rescues the job. NULL while its worker's lease (agora.workers.lease_expires_at) "
    "covers it."
)
JOB_LEASE_COMMENT_BEFORE = "A processing job whose lease has passed is rescued by another worker."


def _comment_job_lease(comment: str) -> None:
    op.alter_column("jobs", "lease_expires_at", existing_type=sa.DateTime(timezone=True), existing_nullable=True,
                    comment=comment, schema="agora")


def upgrade() -> None:
    _comment_job_lease(JOB_LEASE_COMMENT)
    op.add_column(
        "workers",
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True,
                  comment="Until when the worker's running jobs are its own (renewed by its lease supervisor); "
                          "after this, other workers rescue them. NULL: the worker holds no worker lease."),
        schema="agora",
    )
    op.create_index("jobs_locked_by_idx", "jobs", ["locked_by"], schema="agora",
                    postgresql_where=sa.text("status = 'processing'"))
    op.drop_index("jobs_lease_idx", table_name="jobs", schema="agora")
    op.create_index("jobs_lease_idx", "jobs", ["lease_expires_at"], schema="agora",
                    postgresql_where=sa.text("status = 'processing' AND lease_expires_at IS NOT NULL"))


def downgrade() -> None:
    # Jobs running under a worker lease get a lease of their own, which earlier versions renew.
    op.execute("""
        UPDATE agora.jobs AS j SET lease_expires_at = COALESCE(w.lease_expires_at, now())
        FROM agora.workers AS w
        WHERE j.status = 'processing' AND j.lease_expires_at IS NULL AND w.id = j.locked_by
    """)
    op.execute("UPDATE agora.jobs SET lease_expires_at = now() WHERE status = 'processing' AND lease_expires_at IS NULL")
    op.drop_index("jobs_lease_idx", table_name="jobs", schema="agora")
    op.create_index("jobs_lease_idx", "jobs", ["lease_expires_at"], schema="agora",
                    postgresql_where=sa.text("status = 'processing'"))
    op.drop_index("jobs_locked_by_idx", table_name="jobs", schema="agora")
    op.drop_column("workers", "lease_expires_at", schema="agora")
    _comment_job_lease(JOB_LEASE_COMMENT_BEFORE)
