"""The counters and histograms each worker process keeps (``agora_jobs_completed_total``,
``agora_job_duration_seconds``, ...) published to the database, so that the API's
``/metrics`` serves the fleet's under the same names as a worker's own ``/metrics``.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "process_tallies",
        sa.Column("process_id", sa.Text(), primary_key=True,
                  comment="host:pid:token of a worker process, or '(retired)': the sum of processes gone quiet"),
        sa.Column("tallies", postgresql.JSONB(), nullable=False,
                  comment="The process's counters and histogram buckets since it started (process_metrics.snapshot)"),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
                  comment="When the process last published them (every 10 s while it runs)"),
        schema="agora",
        comment="Counters of worker processes for the API's /metrics; a process silent for 10 minutes is "
                "folded into the '(retired)' row, so that the sums never go down.",
    )


def downgrade() -> None:
    op.drop_table("process_tallies", schema="agora")
