"""Each job status tied to its columns by CHECK constraints, so the database refuses an
impossible row (the transition table in Python that no SQL consulted goes):

- ``jobs_locked_while_processing``: ``locked_by`` is set exactly while a job is
  ``processing`` (every claim sets both, every way out clears both);
- ``jobs_lease_while_processing``: a lease of the job's own only while it runs;
- ``jobs_started_while_processing``: a running job has a start;
- ``jobs_finished_at_when_ended``: a ``done`` or ``cancelled`` job has its end;
- ``jobs_delayed_while_waiting``: only a job waiting to run (``pending``, or ``failed``
  and waiting for its retry) is delayed.

Rows written by hand that break them are mended first (agora-pg itself writes none):
an ended job without its end gets its start (else its creation) as its end; a
``processing`` row with no worker goes back to ``pending``; a worker, a lease or a delay
left on a row whose status has none is cleared. Each constraint is then added ``NOT
VALID`` (no table scan under the exclusive lock) and validated (a scan under a lock that
lets claims and outcomes go on).

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

CHECKS = {
    "jobs_locked_while_processing": "(status = 'processing') = (locked_by IS NOT NULL)",
    "jobs_lease_while_processing": "lease_expires_at IS NULL OR status = 'processing'",
    "jobs_started_while_processing": "status <> 'processing' OR started_at IS NOT NULL",
    "jobs_finished_at_when_ended": "status NOT IN ('done', 'cancelled') OR finished_at IS NOT NULL",
    "jobs_delayed_while_waiting": "NOT delayed OR status IN ('pending', 'failed')",
}


MEND = (
    "UPDATE agora.jobs SET finished_at = coalesce(started_at, created_at) "
    "WHERE status IN ('done', 'cancelled') AND finished_at IS NULL",
    "UPDATE agora.jobs SET status = 'pending', lease_expires_at = NULL WHERE status = 'processing' AND locked_by IS NULL",
    "UPDATE agora.jobs SET started_at = coalesce(started_at, now()) WHERE status = 'processing' AND started_at IS NULL",
    "UPDATE agora.jobs SET locked_by = NULL, lease_expires_at = NULL "
    "WHERE status <> 'processing' AND (locked_by IS NOT NULL OR lease_expires_at IS NOT NULL)",
    "UPDATE agora.jobs SET delayed = false WHERE delayed AND status NOT IN ('pending', 'failed')",
)


def upgrade() -> None:
    for mend in MEND:
        op.execute(mend)
    for name, condition in CHECKS.items():
        op.execute(f"ALTER TABLE agora.jobs ADD CONSTRAINT {name} CHECK ({condition}) NOT VALID")
        op.execute(f"ALTER TABLE agora.jobs VALIDATE CONSTRAINT {name}")


def downgrade() -> None:
    for name in reversed(CHECKS):
        op.execute(f"ALTER TABLE agora.jobs DROP CONSTRAINT {name}")
