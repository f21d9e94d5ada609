"""Limits per queue: ``agora.queue_limits`` holds, for a queue, the most of its jobs that
may run at once across every worker, and the most that may start in any window;
``agora.queue_starts`` the starts a rate limit counts. A claim of a limited queue locks
its row, then counts the queue's running jobs and starts in statements of their own
(whose snapshots see every claim that held the lock before), and takes at most what is
left.

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
        sa.Column("concurrency", sa.Integer(), nullable=True,
                  comment="At most this many of the queue's jobs run at once, across every worker; NULL: no "
                          "concurrency limit."),
        sa.Column("rate", sa.Integer(), nullable=True,
                  comment="At most this many of the queue's jobs start in any rate_seconds; NULL: no rate limit."),
        sa.Column("rate_seconds", sa.Float(), nullable=True, comment="The window of the rate limit, in seconds."),
        sa.Column("declared_in", sa.Text(), nullable=False, server_default=sa.text("'code'"),
                  comment="Where the limit was declared: 'code' (handlers.queue) or 'config' (an agora/v1 "
                          "[queues.NAME] table, which a code declaration leaves alone)."),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
                  comment="When the limit was last declared differently."),
        sa.CheckConstraint("concurrency >= 1", name="queue_limits_concurrency_positive"),
        sa.CheckConstraint("(rate IS NULL) = (rate_seconds IS NULL) AND (rate IS NULL OR (rate > 0 AND rate_seconds > 0))",
                           name="queue_limits_rate_positive"),
        sa.CheckConstraint("concurrency IS NOT NULL OR rate IS NOT NULL", name="queue_limits_some_limit"),
        sa.CheckConstraint("declared_in IN ('code', 'config')", name="queue_limits_declared_in_known"),
        schema="agora",
        comment="Concurrency and rate limits of queues, declared by the workers that claim them or by an agora/v1 "
                "config.",
    )
    op.create_table(
        "queue_starts",
        sa.Column("queue", sa.Text(), nullable=False, comment="The rate-limited queue."),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False,
                  comment="When the claim started the job (the database's clock once the queue's lock was held)."),
        schema="agora",
        comment="Starts of rate-limited queues' jobs within their window (older ones are deleted by the claims).",
    )
    op.create_index("queue_starts_queue_idx", "queue_starts", ["queue", "started_at"], schema="agora")


def downgrade() -> None:
    op.drop_table("queue_starts", schema="agora")
    op.drop_table("queue_limits", schema="agora")
