"""Schedules have a lifecycle: ``agora.schedules.declared_at`` is when a live process last
declared the schedule (its registration, then its scheduler's passes, at most every 10 s);
one that no process has declared for 120 s is orphaned (its code is gone, or its workers
are down), which ``agora.schedule_health.orphaned_since`` says (and ``in_trouble``, for an
active one). ``agora-pg schedules delete`` removes a schedule.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-07
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None

# (agora_pg.schedules.SCHEDULE_ORPHANED_AFTER_SECONDS at this revision)
ORPHANED = "s.declared_at < now() - interval '120 seconds'"
RUNNING = ("EXISTS (SELECT FROM agora.jobs AS j WHERE j.dedup_key = 'pipeline:' || s.pipeline_id "
           "AND j.status IN ('pending', 'processing'))")
HEALTH = """
CREATE OR REPLACE VIEW agora.schedule_health AS
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
        OR (s.state = 'active' AND s.next_run_at < now() - interval '1 minute' AND NOT {running})
        {orphaned_trouble}) AS in_trouble{orphaned_column}
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


def upgrade() -> None:
    op.add_column("schedules", sa.Column(
        "declared_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()"),
        comment="When a live process last declared the schedule (registered it, or its scheduler read it: at most "
                "every 10 s); 120 s without one: orphaned."), schema="agora")
    op.execute(HEALTH.format(running=RUNNING, orphaned_trouble=f"OR (s.state = 'active' AND {ORPHANED})",
                             orphaned_column=f",\n       CASE WHEN {ORPHANED} THEN s.declared_at END AS orphaned_since"))


def downgrade() -> None:
    op.execute("DROP VIEW agora.schedule_health")
    op.execute(HEALTH.replace("CREATE OR REPLACE VIEW", "CREATE VIEW").format(
        running=RUNNING, orphaned_trouble="", orphaned_column=""))
    op.execute("COMMENT ON VIEW agora.schedule_health IS 'Per scheduled pipeline: state, next run, last result, "
               "errors and backoff, the last day''s runs, and whether it needs a look (in_trouble).'")
    op.drop_column("schedules", "declared_at", schema="agora")
