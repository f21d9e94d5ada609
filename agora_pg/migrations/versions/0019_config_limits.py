"""Flow control declared in an ``agora/v1`` config: ``agora.kind_limits.declared_in``
says whether a kind's limits come from the code of the workers that handle it
(``code``) or from a config worker's ``[kinds.NAME]`` table (``config``). A config's
declaration wins: a code worker's declaration leaves a ``config`` row alone.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("kind_limits", sa.Column(
        "declared_in", sa.Text(), nullable=False, server_default=sa.text("'code'"),
        comment="Where the limits were declared: 'code' (handlers.kind) or 'config' (an agora/v1 [kinds.NAME] "
                "table, which a code declaration leaves alone)."), schema="agora")
    op.create_check_constraint("kind_limits_declared_in_known", "kind_limits", "declared_in IN ('code', 'config')",
                               schema="agora")
    op.create_table_comment("kind_limits", "Flow control of job kinds (concurrency and rate limits, fair share), "
                            "declared by the workers that handle them or by an agora/v1 config.", schema="agora")


def downgrade() -> None:
    op.create_table_comment("kind_limits", "Flow control of job kinds (concurrency and rate limits, fair share), "
                            "declared by the workers that handle them.", schema="agora")
    op.drop_constraint("kind_limits_declared_in_known", "kind_limits", schema="agora")
    op.drop_column("kind_limits", "declared_in", schema="agora")
