"""Concurrency limits per queue: ``agora.queue_limits`` holds, for a queue, the most of
its jobs that may run at once across every worker. A claim of a limited queue locks its
row, then counts the queue's running jobs in a statement of its own (whose snapshot sees
every claim that held the lock before), and takes at most what is left.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "queue_limits",
        sa.Column("queue", sa.Text(), primary_key=True, comment="The limited queue."),
        sa.Column("concurrency", sa.Integer(), nullable=False,
                  comment="At most this many of the queue's jobs run at once, across every worker."),
        sa.Column("declared_in", sa.Text(), nullable=False, server_default=sa.text("'code'"),
                  comment="Where the limit was declared: 'code' (handlers.queue) or 'config' (an agora/v1 "
                          "[queues.NAME] table, which a code declaration leaves alone)."),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
                  comment="When the limit was last declared differently."),
        sa.CheckConstraint("concurrency >= 1", name="queue_limits_concurrency_positive"),
        sa.CheckConstraint("declared_in IN ('code', 'config')", name="queue_limits_declared_in_known"),
        schema="agora",
        comment="Concurrency limits of queues, declared by the workers that claim them or by an agora/v1 config.",
    )


def downgrade() -> None:
    op.drop_table("queue_limits", schema="agora")
