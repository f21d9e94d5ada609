"""Leases and outcomes: lost attempts counted apart, timeouts, cancelling running jobs,
stored tracebacks, and the run a pipeline's lease belongs to.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


RETRY_COUNT_COMMENTS = ("Failed attempts so far (a lost worker counts as one).",
                        "Failed attempts so far (lost attempts are counted in lost_count).")
RUN_STATUS_COMMENTS = (
    "running, succeeded, failed, abandoned (worker lost) or cancelled (released at shutdown).",
    "running, succeeded, failed, abandoned (lease lost: worker gone or cut off) or cancelled "
    "(on request, or released at shutdown).",
)


def _comment(table: str, column: str, comments: tuple[str, str], new: bool) -> None:
    old_text, new_text = comments
    op.alter_column(table, column, schema="agora", comment=new_text if new else old_text,
                    existing_comment=old_text if new else new_text)


def upgrade() -> None:
    _comment("jobs", "retry_count", RETRY_COUNT_COMMENTS, new=True)
    _comment("runs", "status", RUN_STATUS_COMMENTS, new=True)
    op.add_column(
        "jobs",
        sa.Column("lost_count", sa.Integer, nullable=False, server_default=sa.text("0"),
                  comment="Attempts lost with their worker or cut short at shutdown; WORKER_MAX_LOST_ATTEMPTS of them fail the job."),
        schema="agora",
    )
    op.add_column(
        "jobs",
        sa.Column("timeout_seconds", sa.Float, nullable=True,
                  comment="Seconds an attempt may run before it is cancelled; NULL takes the kind's or the worker's default."),
        schema="agora",
    )
    op.add_column(
        "jobs",
        sa.Column("cancel_requested_at", TZ, nullable=True,
                  comment="When a cancel of the running attempt was asked for; its worker stops it."),
        schema="agora",
    )
    op.create_check_constraint("jobs_lost_count_check", "jobs", "lost_count >= 0", schema="agora")
    op.create_check_constraint("jobs_timeout_seconds_check", "jobs", "timeout_seconds > 0", schema="agora")
    op.add_column(
        "runs",
        sa.Column("traceback", sa.Text, nullable=True, comment="Traceback of a failed attempt (capped in size)."),
        schema="agora",
    )
    op.add_column(
        "schedules",
        sa.Column("lease_run_id", sa.BigInteger, nullable=True,
                  comment="The agora.runs row of the run that holds the lease."),
        schema="agora",
    )


def downgrade() -> None:
    op.drop_column("schedules", "lease_run_id", schema="agora")
    op.drop_column("runs", "traceback", schema="agora")
    op.drop_constraint("jobs_timeout_seconds_check", "jobs", schema="agora")
    op.drop_constraint("jobs_lost_count_check", "jobs", schema="agora")
    op.drop_column("jobs", "cancel_requested_at", schema="agora")
    op.drop_column("jobs", "timeout_seconds", schema="agora")
    op.drop_column("jobs", "lost_count", schema="agora")
    _comment("runs", "status", RUN_STATUS_COMMENTS, new=False)
    _comment("jobs", "retry_count", RETRY_COUNT_COMMENTS, new=False)
