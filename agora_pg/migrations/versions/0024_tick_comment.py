"""``agora.runs.scheduled_for`` is not unique per pipeline (migration 0013 made its index
plain): its comment says so.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None

BEFORE = "The schedule tick a pipeline run belongs to; unique per pipeline."
AFTER = ("The schedule tick the run belongs to (a pipeline's run, or a periodic job's tick); not unique: a run "
         "retried by hand is another run of its tick.")


def _comment(comment: str, before: str) -> None:
    op.alter_column("runs", "scheduled_for", existing_type=sa.DateTime(timezone=True), existing_nullable=True,
                    comment=comment, existing_comment=before, schema="agora")


def upgrade() -> None:
    _comment(AFTER, BEFORE)


def downgrade() -> None:
    _comment(BEFORE, AFTER)
