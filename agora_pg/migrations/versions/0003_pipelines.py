"""Pipelines: agora.checkpoints (resumable sources) and agora.dead_letters.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "checkpoints",
        sa.Column("pipeline_id", sa.Text, primary_key=True, comment="The pipeline whose source position this is."),
        sa.Column("position", JSONB, nullable=False, comment="Where the next run resumes: a CSV row count, a SQL key, ..."),
        sa.Column("source", sa.Text, nullable=False, comment="Which source the position belongs to (a changed source starts over)."),
        sa.Column("run_id", sa.BigInteger, nullable=True, comment="The agora.runs row of the run that saved it."),
        sa.Column("updated_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When it was saved."),
        schema="agora",
        comment="The position of each resumable pipeline source, saved with (or right after) each written batch.",
    )
    op.create_table(
        "dead_letters",
        sa.Column("id", sa.BigInteger, sa.Identity(always=False), primary_key=True),
        sa.Column("pipeline_id", sa.Text, nullable=False, comment="The pipeline that rejected the record."),
        sa.Column("run_id", sa.BigInteger, nullable=True, comment="The agora.runs row of that run."),
        sa.Column("stage", sa.Text, nullable=False, comment="Which step or sink rejected it, e.g. 'map:parse' or 'sink:database'."),
        sa.Column("record", JSONB, nullable=False, comment="The record as the stage received it."),
        sa.Column("error_type", sa.Text, nullable=False, comment="Class name of the error."),
        sa.Column("error_message", sa.Text, nullable=False, comment="Text of the error."),
        sa.Column("created_at", TZ, nullable=False, server_default=sa.text("now()"), comment="When it was rejected."),
        sa.Column("replayed_at", TZ, nullable=True, comment="When agora-pg dlq replay wrote it successfully; NULL while waiting."),
        schema="agora",
        comment="Records a pipeline step or sink rejected, kept for inspection and replay.",
    )
    op.create_index(
        "dead_letters_waiting_idx", "dead_letters", ["pipeline_id", "id"], schema="agora",
        postgresql_where=sa.text("replayed_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index("dead_letters_waiting_idx", table_name="dead_letters", schema="agora")
    op.drop_table("dead_letters", schema="agora")
    op.drop_table("checkpoints", schema="agora")
