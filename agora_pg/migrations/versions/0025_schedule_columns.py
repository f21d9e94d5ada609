"""A job says which schedule and tick it runs in columns of its own: ``schedule_id``,
``scheduled_for`` and, for a pipeline's run, ``run_plan`` (the spec it was planned under,
its next run after a success, its launch). No statement reads them from the payload or
tests the queue name ``agora:pipelines`` any more. Jobs already enqueued are filled in
from their payload (a pipeline's run) or from their tick's run (a periodic job's).

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

SCHEDULE_ID = "The schedule (agora.schedules.pipeline_id) this job runs a tick of, or the pipeline it runs once; NULL: a plain job."
SCHEDULED_FOR = "The tick this job runs (a schedule's), or when a pipeline's run outside its schedule was asked for."
RUN_PLAN = ("A pipeline's run: {spec, next_at or next_in_seconds, launch}, what its end writes to its schedule "
            "({} outside its schedule); its one attempt is the run (its schedule, not the job, retries). NULL: not a "
            "pipeline's run.")

FILL_PIPELINE_RUNS = """
UPDATE agora.jobs SET schedule_id = kind, scheduled_for = (payload->>'scheduled_for')::timestamptz,
    run_plan = jsonb_strip_nulls(jsonb_build_object('spec', payload->'spec', 'next_at', payload->'next_at',
        'next_in_seconds', payload->'next_in_seconds', 'launch', payload->'launch'))
WHERE queue = 'agora:pipelines'
"""
FILL_PERIODIC_JOBS = """
UPDATE agora.jobs AS j SET schedule_id = r.pipeline_id, scheduled_for = r.scheduled_for
FROM agora.runs AS r WHERE r.job_id IS NULL AND r.result ? 'job_id' AND (r.result->>'job_id')::bigint = j.id
"""


def upgrade() -> None:
    op.add_column("jobs", sa.Column("schedule_id", sa.Text(), nullable=True, comment=SCHEDULE_ID), schema="agora")
    op.add_column("jobs", sa.Column("scheduled_for", sa.DateTime(timezone=True), nullable=True,
                                    comment=SCHEDULED_FOR), schema="agora")
    op.add_column("jobs", sa.Column("run_plan", JSONB(), nullable=True, comment=RUN_PLAN), schema="agora")
    op.execute(FILL_PIPELINE_RUNS)
    op.execute(FILL_PERIODIC_JOBS)
    op.create_index("jobs_schedule_idx", "jobs", ["schedule_id", "scheduled_for"], schema="agora",
                    postgresql_where=sa.text("schedule_id IS NOT NULL"))


def downgrade() -> None:
    op.drop_index("jobs_schedule_idx", table_name="jobs", schema="agora")
    for column in ("run_plan", "scheduled_for", "schedule_id"):
        op.drop_column("jobs", column, schema="agora")
