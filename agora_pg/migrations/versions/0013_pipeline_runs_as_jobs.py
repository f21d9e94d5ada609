"""A scheduled pipeline's run is a job: the schedules lose their run lease.

A pipeline's tick is now a job of the queue ``agora:pipelines`` (kind: the pipeline id,
dedup key ``pipeline:<id>``), claimed, leased, rescued and fenced like any job; its end
updates the schedule row. So:

- ``agora.schedules`` loses ``lease_owner``, ``lease_expires_at`` and ``lease_run_id``
  (who runs a pipeline now is the worker holding its live job). A run in flight at the
  upgrade (there should be none: stop the workers first) is recorded abandoned, and its
  schedule is due again at once, uncounted.
- ``agora.workers`` loses ``runs_pipelines`` (the processes no longer share out ticks:
  the first scheduler to lock a due schedule enqueues its run).
- ``agora.runs``' ``(pipeline_id, scheduled_for)`` index is no longer unique: a tick is
  enqueued once (its schedule row is locked and advanced in the same transaction, and one
  job per pipeline is alive at a time), and a run retried by hand is another run of it.
- ``agora.dead_letters`` and ``agora.checkpoints`` get ``job_id``: the job of the run that
  wrote them (a run's ``agora.runs`` row is written when it ends).
- ``agora.schedule_health`` says a pipeline is running when its job is.

The downgrade puts the columns back (empty: the pipelines are idle), the unique index
(it fails if a tick was run twice by hand meanwhile) and the view.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)

_HEALTH = """
CREATE VIEW agora.schedule_health AS
SELECT s.pipeline_id, s.schedule_spec AS schedule, s.state, s.next_run_at,
       {running} AS running,
       s.last_status, s.last_started_at, s.last_finished_at, s.last_error,
       s.consecutive_errors, s.max_consecutive_errors,
       CASE WHEN s.consecutive_errors > 0 AND s.state = 'active' THEN s.next_run_at END AS backoff_until,
       greatest(extract(epoch FROM now() - s.next_run_at), 0) AS overdue_seconds,
       coalesce(r.runs_last_day, 0) AS runs_last_day,
       coalesce(r.failed_last_day, 0) AS failed_last_day,
       r.run_seconds_p50, r.run_seconds_max,
       (s.state = 'stopped' OR (s.state = 'active' AND s.consecutive_errors > 0)
        OR (s.state = 'active' AND s.next_run_at < now() - interval '1 minute' AND NOT {running})) AS in_trouble
FROM agora.schedules AS s
LEFT JOIN LATERAL (
    SELECT count(*) AS runs_last_day,
           count(*) FILTER (WHERE status IN ('failed', 'abandoned')) AS failed_last_day,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM finished_at - started_at))
               AS run_seconds_p50,
           max(extract(epoch FROM finished_at - started_at)) AS run_seconds_max
    FROM agora.runs
    WHERE pipeline_id = s.pipeline_id AND finished_at > now() - interval '1 day'
) AS r ON true
"""
RUNNING_NOW = ("EXISTS (SELECT FROM agora.jobs AS j WHERE j.dedup_key = 'pipeline:' || s.pipeline_id "
               "AND j.status IN ('pending', 'processing'))")
RUNNING_BEFORE = "(s.lease_owner IS NOT NULL AND s.lease_expires_at > now())"
HEALTH_COMMENT = ("Per scheduled pipeline: state, next run, last result, errors and backoff, "
                  "the last day's runs, and whether it needs a look (in_trouble).")


def _health_view(running: str) -> None:
    op.execute("DROP VIEW agora.schedule_health")
    op.execute(_HEALTH.format(running=running))
    op.execute(f"COMMENT ON VIEW agora.schedule_health IS '{HEALTH_COMMENT.replace(chr(39), chr(39) * 2)}'")


def upgrade() -> None:
    op.execute("""
        UPDATE agora.runs AS r
        SET status = 'abandoned', finished_at = now(), error_type = 'WorkerLost',
            error_message = 'WorkerLost: the run was in flight when the schema was upgraded'
        FROM agora.schedules AS s
        WHERE r.id = s.lease_run_id AND r.status = 'running'
    """)
    op.execute("""
        UPDATE agora.schedules
        SET last_status = 'abandoned', last_finished_at = now(),
            next_run_at = CASE WHEN state = 'active' THEN now() ELSE next_run_at END
        WHERE lease_owner IS NOT NULL
    """)
    _health_view(RUNNING_NOW)
    for column in ("lease_owner", "lease_expires_at", "lease_run_id"):
        op.drop_column("schedules", column, schema="agora")
    op.drop_column("workers", "runs_pipelines", schema="agora")
    op.drop_index("runs_pipeline_tick_idx", table_name="runs", schema="agora")
    op.create_index("runs_pipeline_tick_idx", "runs", ["pipeline_id", "scheduled_for"], schema="agora",
                    postgresql_where=sa.text("pipeline_id IS NOT NULL"))
    for table, what in (("dead_letters", "rejected the record"), ("checkpoints", "saved it")):
        op.add_column(table, sa.Column("job_id", sa.BigInteger, nullable=True,
                                       comment=f"The agora.jobs row of the run that {what}."), schema="agora")
    op.execute("COMMENT ON TABLE agora.schedules IS "
               "'One row per schedule (a pipeline''s or a periodic job''s): its durable state.'")


def downgrade() -> None:
    for table in ("dead_letters", "checkpoints"):
        op.drop_column(table, "job_id", schema="agora")
    op.drop_index("runs_pipeline_tick_idx", table_name="runs", schema="agora")
    op.create_index("runs_pipeline_tick_idx", "runs", ["pipeline_id", "scheduled_for"], unique=True,
                    schema="agora", postgresql_where=sa.text("pipeline_id IS NOT NULL"))
    op.add_column("workers", sa.Column("runs_pipelines", sa.Boolean, nullable=False, server_default=sa.text("false"),
                                       comment="The worker's process runs scheduled pipelines: while its lease is "
                                               "live, it is one of the processes that share the pipelines' ticks."),
                  schema="agora")
    op.add_column("schedules", sa.Column("lease_owner", sa.Text, nullable=True,
                                         comment="Worker running the pipeline now (agora.workers.id)."),
                  schema="agora")
    op.add_column("schedules", sa.Column("lease_expires_at", TZ, nullable=True,
                                         comment="After this, another worker may take the run over."),
                  schema="agora")
    op.add_column("schedules", sa.Column("lease_run_id", sa.BigInteger, nullable=True,
                                         comment="The agora.runs row of the run that holds the lease."),
                  schema="agora")
    _health_view(RUNNING_BEFORE)
    op.execute("COMMENT ON TABLE agora.schedules IS "
               "'One row per scheduled pipeline: its durable schedule state and run lease.'")
