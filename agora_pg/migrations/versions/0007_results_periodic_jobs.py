"""A job attempt's result (the JSON its handler returned, on the attempt's run row), and
the kind a periodic job's schedule enqueues.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

RESULT_COMMENT = (
    "What the handler of a succeeded attempt returned, as JSON (NULL: it returned None, or a value "
    "JSON cannot hold). Kept as long as the run row: history retention removes it with its job."
)

JOB_KIND_COMMENT = "A periodic job's kind: each tick enqueues one job of it. NULL: the schedule runs a pipeline."


def upgrade() -> None:
    op.add_column("runs", sa.Column("result", JSONB, nullable=True, comment=RESULT_COMMENT), schema="agora")
    op.add_column("schedules", sa.Column("job_kind", sa.Text, nullable=True, comment=JOB_KIND_COMMENT),
                  schema="agora")


def downgrade() -> None:
    op.drop_column("schedules", "job_kind", schema="agora")
    op.drop_column("runs", "result", schema="agora")
