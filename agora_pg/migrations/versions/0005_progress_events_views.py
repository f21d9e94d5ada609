"""Progress on the attempt's row, indexes the event stream reads by time, and views for
the common questions (the queue right now, job statistics, schedule health).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# A job with work ahead of it, named the way /metrics names it: a failed job with a retry
# left is 'retrying' (status stays 'failed' in agora.jobs).
QUEUE_NOW = """
CREATE VIEW agora.queue_now AS
SELECT queue,
       CASE WHEN status = 'failed' THEN 'retrying' ELSE status END AS state,
       count(*) AS jobs,
       count(*) FILTER (WHERE status <> 'processing' AND run_at <= now()) AS due,
       extract(epoch FROM now() - min(run_at) FILTER (WHERE status <> 'processing' AND run_at <= now()))
           AS oldest_due_seconds
FROM agora.jobs
WHERE status IN ('pending', 'processing') OR (status = 'failed' AND retry_count < max_retries)
GROUP BY queue, 2
"""

JOB_STATS = """
CREATE VIEW agora.job_stats AS
WITH counts AS (
    SELECT queue, kind,
           count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'processing') AS processing,
           count(*) FILTER (WHERE status = 'failed' AND retry_count < max_retries) AS retrying,
           count(*) FILTER (WHERE status = 'done') AS done,
           count(*) FILTER (WHERE status = 'failed' AND NOT coalesce(retry_count < max_retries, false)) AS failed,
           count(*) FILTER (WHERE status = 'cancelled') AS cancelled
    FROM agora.jobs GROUP BY queue, kind
), last_hour AS (
    SELECT j.queue, j.kind,
           count(*) FILTER (WHERE r.status = 'succeeded') AS succeeded_last_hour,
           count(*) FILTER (WHERE r.status <> 'succeeded') AS failed_attempts_last_hour,
           round(count(*) FILTER (WHERE r.status <> 'succeeded')::numeric / count(*), 4) AS failure_rate_last_hour,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM r.finished_at - r.started_at))
               AS run_seconds_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM r.finished_at - r.started_at))
               AS run_seconds_p95,
           percentile_cont(0.99) WITHIN GROUP (ORDER BY extract(epoch FROM r.finished_at - r.started_at))
               AS run_seconds_p99,
           percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM j.started_at - j.run_at))
               FILTER (WHERE r.status = 'succeeded' AND r.attempt = j.attempt) AS wait_seconds_p50,
           percentile_cont(0.95) WITHIN GROUP (ORDER BY extract(epoch FROM j.started_at - j.run_at))
               FILTER (WHERE r.status = 'succeeded' AND r.attempt = j.attempt) AS wait_seconds_p95
    FROM agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id
    WHERE r.finished_at > now() - interval '1 hour'
    GROUP BY j.queue, j.kind
)
SELECT c.queue, c.kind, c.pending, c.processing, c.retrying, c.done, c.failed, c.cancelled,
       coalesce(h.succeeded_last_hour, 0) AS succeeded_last_hour,
       coalesce(h.failed_attempts_last_hour, 0) AS failed_attempts_last_hour,
       h.failure_rate_last_hour, h.run_seconds_p50, h.run_seconds_p95, h.run_seconds_p99,
       h.wait_seconds_p50, h.wait_seconds_p95
FROM counts AS c LEFT JOIN last_hour AS h USING (queue, kind)
"""

SCHEDULE_HEALTH = """
CREATE VIEW agora.schedule_health AS
SELECT s.pipeline_id, s.schedule_spec AS schedule, s.state, s.next_run_at,
       s.lease_owner IS NOT NULL AND s.lease_expires_at > now() AS running,
       s.last_status, s.last_started_at, s.last_finished_at, s.last_error,
       s.consecutive_errors, s.max_consecutive_errors,
       CASE WHEN s.consecutive_errors > 0 AND s.state = 'active' THEN s.next_run_at END AS backoff_until,
       greatest(extract(epoch FROM now() - s.next_run_at), 0) AS overdue_seconds,
       coalesce(r.runs_last_day, 0) AS runs_last_day,
       coalesce(r.failed_last_day, 0) AS failed_last_day,
       r.run_seconds_p50, r.run_seconds_max,
       (s.state = 'stopped' OR (s.state = 'active' AND s.consecutive_errors > 0)
        OR (s.state = 'active' AND s.next_run_at < now() - interval '1 minute'
            AND NOT (s.lease_owner IS NOT NULL AND s.lease_expires_at > now()))) AS in_trouble
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

VIEW_COMMENTS = {
    "queue_now": "Jobs with work ahead of them by queue and state (pending, processing, retrying); "
                 "what /metrics reports as agora_jobs.",
    "job_stats": "Per queue and kind: jobs by status, and over the last hour attempts, failure rate, "
                 "run time and queue wait percentiles. Reads the whole jobs table.",
    "schedule_health": "Per scheduled pipeline: state, next run, last result, errors and backoff, "
                       "the last day's runs, and whether it needs a look (in_trouble).",
}


def upgrade() -> None:
    op.add_column(
        "jobs",
        sa.Column("progress", JSONB, nullable=True,
                  comment="The running attempt's latest progress report ({done, total, message, at}); "
                          "kept with the run when it ends."),
        schema="agora",
    )
    op.add_column(
        "runs",
        sa.Column("progress", JSONB, nullable=True,
                  comment="Latest progress of the attempt: a job's last report, a pipeline run's records "
                          "read, written and rejected."),
        schema="agora",
    )
    # The event stream reads changes since a time: jobs enqueued (BRIN: created_at follows
    # the table's physical order and never changes, so it costs next to nothing to keep),
    # pending jobs cancelled, and pipeline runs started.
    op.create_index("jobs_created_at_brin", "jobs", ["created_at"], schema="agora", postgresql_using="brin")
    op.create_index("jobs_cancelled_idx", "jobs", ["finished_at"], schema="agora",
                    postgresql_where=sa.text("status = 'cancelled'"))
    op.create_index("runs_pipeline_started_idx", "runs", ["started_at"], schema="agora",
                    postgresql_where=sa.text("pipeline_id IS NOT NULL"))
    for statement in (QUEUE_NOW, JOB_STATS, SCHEDULE_HEALTH):
        op.execute(statement)
    for view, comment in VIEW_COMMENTS.items():
        quoted = comment.replace("'", "''")  # a constant of this file (COMMENT takes no parameters)
        op.execute(f"COMMENT ON VIEW agora.{view} IS '{quoted}'")


def downgrade() -> None:
    for view in VIEW_COMMENTS:
        op.execute(f"DROP VIEW IF EXISTS agora.{view}")
    op.drop_index("runs_pipeline_started_idx", table_name="runs", schema="agora")
    op.drop_index("jobs_cancelled_idx", table_name="jobs", schema="agora")
    op.drop_index("jobs_created_at_brin", table_name="jobs", schema="agora")
    op.drop_column("runs", "progress", schema="agora")
    op.drop_column("jobs", "progress", schema="agora")
