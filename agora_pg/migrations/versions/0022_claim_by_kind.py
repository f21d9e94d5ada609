"""A worker claims only the kinds it handles: the claim index leads with (queue, kind),
so that a claim reads each of its kinds' due jobs in order and never walks past jobs of
kinds it does not handle (they wait for a worker that does). A done job keeps no error
message of an earlier attempt (that attempt's run row has it).

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None

CLAIMABLE_NOW = "(status = 'pending' OR (status = 'failed' AND retry_count < max_retries)) AND NOT delayed"


def _claim_index(*columns: str) -> None:
    op.drop_index("jobs_claimable_idx", table_name="jobs", schema="agora")
    op.create_index("jobs_claimable_idx", "jobs", [*columns, sa.text("priority DESC"), "run_at", "id"],
                    schema="agora", postgresql_where=sa.text(CLAIMABLE_NOW))


def upgrade() -> None:
    _claim_index("queue", "kind")
    op.execute("UPDATE agora.jobs SET error_message = NULL WHERE status = 'done' AND error_message IS NOT NULL")


def downgrade() -> None:
    _claim_index("queue")
