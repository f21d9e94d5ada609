"""The kinds each worker handles: ``agora.workers.kinds``, written when it starts, so that
``POST /jobs`` can say when no live worker handles a job's kind (a typo such as
``ecoh`` waits for ever, or fails for want of a handler).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("workers", sa.Column(
        "kinds", postgresql.ARRAY(sa.Text()), nullable=True,
        comment="The job kinds the worker handles; NULL: not known (a worker of an earlier version)."), schema="agora")


def downgrade() -> None:
    op.drop_column("workers", "kinds", schema="agora")
