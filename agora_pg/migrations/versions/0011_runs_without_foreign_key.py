"""``agora.runs.job_id`` without its foreign key: a trigger deletes a job's runs with it.

Every run row of a job is inserted by the statement that updates the job's row (the
outcome write, the rescue), so the row exists by construction; the foreign key checked
it again for each run with a query of its own that also locked the job's row
(``SELECT ... FOR KEY SHARE``, one more WAL record per job). In a 100,000-job drain the
check was about a fifth of the server's CPU per job (28 us against 22) and the outcome
write took 3.0 ms a batch of 250 instead of 4.7.

What the foreign key did on delete stays: ``jobs_delete_runs`` (after a ``DELETE`` on
``agora.jobs``, once per statement) deletes the runs of the deleted jobs, as ``ON DELETE
CASCADE`` did, and ``jobs_truncate_runs`` deletes every job's runs after a ``TRUNCATE``
of ``agora.jobs`` (which the foreign key refused); pipeline runs (``job_id`` NULL) stay.
A run inserted by hand with a ``job_id`` of no job is no longer refused.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# ``= ANY(ARRAY(...))`` rather than a join with the transition table: the planner knows
# nothing of its size, and a join could scan every run; the array probes the index on
# (job_id, attempt) once per deleted job.
DELETE_RUNS_OF_DELETED_JOBS = """
CREATE FUNCTION agora.delete_runs_of_deleted_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agora.runs WHERE job_id = ANY (ARRAY(SELECT id FROM deleted_jobs));
    RETURN NULL;
END
$$
"""

DELETE_RUNS_OF_TRUNCATED_JOBS = """
CREATE FUNCTION agora.delete_runs_of_truncated_jobs() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    DELETE FROM agora.runs WHERE job_id IS NOT NULL;
    RETURN NULL;
END
$$
"""

# The downgrade's foreign key checks only new rows (NOT VALID) when runs of no job exist,
# so that going back never deletes history.
VALIDATE_UNLESS_ORPHANS = """
DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM agora.runs AS r WHERE r.job_id IS NOT NULL
                   AND NOT EXISTS (SELECT 1 FROM agora.jobs AS j WHERE j.id = r.job_id)) THEN
        ALTER TABLE agora.runs VALIDATE CONSTRAINT runs_job_id_fkey;
    END IF;
END
$$
"""


def upgrade() -> None:
    op.drop_constraint("runs_job_id_fkey", "runs", schema="agora", type_="foreignkey")
    op.execute(DELETE_RUNS_OF_DELETED_JOBS)
    op.execute(
        "CREATE TRIGGER jobs_delete_runs AFTER DELETE ON agora.jobs REFERENCING OLD TABLE AS deleted_jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION agora.delete_runs_of_deleted_jobs()"
    )
    op.execute(DELETE_RUNS_OF_TRUNCATED_JOBS)
    op.execute(
        "CREATE TRIGGER jobs_truncate_runs AFTER TRUNCATE ON agora.jobs "
        "FOR EACH STATEMENT EXECUTE FUNCTION agora.delete_runs_of_truncated_jobs()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER jobs_truncate_runs ON agora.jobs")
    op.execute("DROP FUNCTION agora.delete_runs_of_truncated_jobs()")
    op.execute("DROP TRIGGER jobs_delete_runs ON agora.jobs")
    op.execute("DROP FUNCTION agora.delete_runs_of_deleted_jobs()")
    op.execute(
        "ALTER TABLE agora.runs ADD CONSTRAINT runs_job_id_fkey FOREIGN KEY (job_id) "
        "REFERENCES agora.jobs (id) ON DELETE CASCADE NOT VALID"
    )
    op.execute(VALIDATE_UNLESS_ORPHANS)
