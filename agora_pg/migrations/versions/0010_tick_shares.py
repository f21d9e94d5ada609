"""Shares of the ticks: the processes that run the same scheduled pipelines split who
claims each tick first, instead of all racing for every tick.

- ``agora.workers.runs_pipelines``: the worker's process runs scheduled pipelines. The
  live ones (``lease_expires_at`` in the future) are the peers among whom each pipeline's
  first claimant is chosen (``agora_pg/runner/tick_shares.py``).
- ``agora.schedules`` gets a fillfactor of 50, so that the claim and finish of a run,
  which rewrite the schedule's row, find room on its page (a HOT update: no new entry in
  the primary key, a third fewer WAL records per claim). Existing rows move to pages
  with room at their next update.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

RUNS_PIPELINES_COMMENT = (
    "The worker's process runs scheduled pipelines: while its lease is live, it is one of the processes that "
    "share the pipelines' ticks."
)


def upgrade() -> None:
    op.add_column(
        "workers",
        sa.Column("runs_pipelines", sa.Boolean, nullable=False, server_default=sa.text("false"),
                  comment=RUNS_PIPELINES_COMMENT),
        schema="agora",
    )
    op.execute("ALTER TABLE agora.schedules SET (fillfactor = 50)")


def downgrade() -> None:
    op.execute("ALTER TABLE agora.schedules RESET (fillfactor)")
    op.drop_column("workers", "runs_pipelines", schema="agora")
