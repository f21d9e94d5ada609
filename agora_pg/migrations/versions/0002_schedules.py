"""Durable schedules: agora.schedules and the scheduled tick of pipeline runs.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.add_column(
        "runs",
        sa.Column("scheduled_for", TZ, nullable=True, comment="The schedule tick a pipeline run belongs to; unique per pipeline."),
        schema="agora",
    )
    op.create_index(
        "runs_pipeline_tick_idx", "runs", ["pipeline_id", "scheduled_for"], unique=True, schema="agora",
        postgresql_where=sa.text("pipeline_id IS NOT NULL"),
    )
    op.create_table(
        "schedules",
        sa.Column("pipeline_id", sa.Text, primary_key=True, comment="The ScheduledPipeline's pipeline_id."),
        sa.Column("schedule_kind", sa.Text, nullable=False, comment="every, cron, continuous or once."),
        sa.Column("schedule_spec", sa.Text, nullable=False, comment="Canonical form of the schedule, e.g. 'every 3600s' or 'cron 0 2 * * * Europe/Berlin'."),
        sa.Column("state", sa.Text, nullable=False, server_default=sa.text("'active'"), comment="active, paused, stopped (after max_consecutive_errors) or completed (a once schedule that succeeded)."),
        sa.Column("next_run_at", TZ, nullable=True, comment="When the next run is due; NULL once completed."),
        sa.Column("consecutive_errors", sa.Integer, nullable=False, server_default=sa.text("0"), comment="Failed runs since the last success."),
        sa.Column("last_error", sa.Text, nullable=True, comment="Type and text of the last failed run's error."),
        sa.Column("last_status", sa.Text, nullable=True, comment="Outcome of the last finished run (an agora.runs status)."),
        sa.Column("last_started_at", TZ, nullable=True, comment="When the last run started."),
        sa.Column("last_finished_at", TZ, nullable=True, comment="When the last run finished."),
        sa.Column("lease_owner", sa.Text, nullable=True, comment="Worker running the pipeline now (agora.workers.id)."),
        sa.Column("lease_expires_at", TZ, nullable=True, comment="After this, another worker may take the run over."),
        sa.Column("error_backoff_seconds", sa.Float, nullable=False, server_default=sa.text("60"), comment="Base of the exponential delay after a failed run."),
        sa.Column("max_consecutive_errors", sa.Integer, nullable=False, server_default=sa.text("10"), comment="Failed runs in a row after which the schedule stops."),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When the pipeline was first registered."),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When a worker last registered it."),
        sa.CheckConstraint("schedule_kind IN ('every', 'cron', 'continuous', 'once')", name="schedules_kind_check"),
        sa.CheckConstraint("state IN ('active', 'paused', 'stopped', 'completed')", name="schedules_state_check"),
        schema="agora",
        comment="One row per scheduled pipeline: its durable schedule state and run lease.",
    )


def downgrade() -> None:
    op.drop_table("schedules", schema="agora")
    op.drop_index("runs_pipeline_tick_idx", table_name="runs", schema="agora")
    op.drop_column("runs", "scheduled_for", schema="agora")
