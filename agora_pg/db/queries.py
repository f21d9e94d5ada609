"""Every SQL statement agora-pg runs, each with a one-line description.

Parameters are positional (``$1``) for asyncpg. JSON travels as text
(``$n::text::jsonb`` in, ``payload::text`` out) so that statements behave the
same whatever JSON codec a caller's connection has installed.
"""

from __future__ import annotations

from agora_pg.db.tables import ALIVE, CLAIMABLE

JOB_COLUMNS = (
    "id, name, kind, queue, status, payload::text AS payload, priority, run_at, retry_count, "
    "max_retries, error_message, dedup_key, created_at, started_at, finished_at, locked_by, "
    "lease_expires_at, attempt"
)

# -- enqueue -----------------------------------------------------------------

# Insert one job; a live job with the same dedup_key makes it insert nothing.
INSERT_JOB = f"""
INSERT INTO agora.jobs (name, kind, queue, payload, priority, run_at, max_retries, dedup_key)
VALUES ($1, $2, $3, $4::text::jsonb, $5, COALESCE($6::timestamptz, now()), $7, $8)
ON CONFLICT (dedup_key) WHERE {ALIVE} DO NOTHING
RETURNING {JOB_COLUMNS}
"""

# Insert many jobs in one statement, from parallel arrays, in array order.
INSERT_JOBS = f"""
INSERT INTO agora.jobs (name, kind, queue, payload, priority, run_at, max_retries, dedup_key)
SELECT name, kind, queue, payload::jsonb, priority, COALESCE(run_at, now()), max_retries, dedup_key
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::int[], $6::timestamptz[],
            $7::int[], $8::text[])
     AS t(name, kind, queue, payload, priority, run_at, max_retries, dedup_key)
ON CONFLICT (dedup_key) WHERE {ALIVE} DO NOTHING
RETURNING {JOB_COLUMNS}
"""

# The live jobs holding these dedup keys.
SELECT_ALIVE_BY_DEDUP_KEYS = f"""
SELECT {JOB_COLUMNS} FROM agora.jobs
WHERE dedup_key = ANY($1::text[]) AND {ALIVE}
"""

# -- reading and cancelling ----------------------------------------------------

# One job by id.
SELECT_JOB = f"SELECT {JOB_COLUMNS} FROM agora.jobs WHERE id = $1"

# Cancel a job that has not started (pending, or failed and waiting for a retry).
CANCEL_JOB = f"""
UPDATE agora.jobs SET status = 'cancelled', finished_at = now()
WHERE id = $1 AND ({CLAIMABLE})
RETURNING {JOB_COLUMNS}
"""

# -- claiming and finishing --------------------------------------------------

# Claim up to $2 due jobs of the queues $1 for worker $3, with a lease of $4 seconds.
CLAIM_JOBS = f"""
WITH next AS (
    SELECT id FROM agora.jobs
    WHERE ({CLAIMABLE}) AND queue = ANY($1::text[]) AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
UPDATE agora.jobs AS j
SET status = 'processing', started_at = now(), finished_at = NULL, locked_by = $3,
    lease_expires_at = now() + make_interval(secs => $4), attempt = j.attempt + 1
FROM next WHERE j.id = next.id
RETURNING {", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))}
"""

# Mark attempts (id, attempt) done and record their runs; returns the ids that were still theirs.
COMPLETE_SUCCEEDED = """
WITH finished AS (
    UPDATE agora.jobs AS j
    SET status = 'done', finished_at = now(), locked_by = NULL, lease_expires_at = NULL
    FROM unnest($1::bigint[], $2::int[]) AS t(id, attempt)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.status = 'processing'
    RETURNING j.id, j.attempt, j.started_at
)
INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status)
SELECT id, attempt, $3, started_at, now(), 'succeeded' FROM finished
RETURNING job_id
"""

# Mark attempts failed (retrying after a delay while retry_count < max_retries) and record their runs.
COMPLETE_FAILED = """
WITH finished AS (
    UPDATE agora.jobs AS j
    SET status = 'failed', retry_count = j.retry_count + 1,
        max_retries = COALESCE(j.max_retries, $6), error_message = t.error_message,
        run_at = now() + make_interval(secs => t.delay), finished_at = now(),
        locked_by = NULL, lease_expires_at = NULL
    FROM unnest($1::bigint[], $2::int[], $3::text[], $4::text[], $5::float8[])
         AS t(id, attempt, error_type, error_message, delay)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.status = 'processing'
    RETURNING j.id, j.attempt, j.started_at, t.error_type, t.error_message
)
INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status, error_type, error_message)
SELECT id, attempt, $7, started_at, now(), 'failed', error_type, error_message FROM finished
RETURNING job_id
"""

# Give unfinished attempts back at shutdown: pending again, no attempt counted, other workers woken.
RELEASE_JOBS = """
WITH released AS (
    UPDATE agora.jobs AS j
    SET status = 'pending', locked_by = NULL, lease_expires_at = NULL
    FROM unnest($1::bigint[], $2::int[]) AS t(id, attempt)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.status = 'processing'
    RETURNING j.id, j.attempt, j.started_at, j.queue
), recorded AS (
    INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status, error_type, error_message)
    SELECT id, attempt, $3, started_at, now(), 'cancelled', 'WorkerShutdown',
           'WorkerShutdown: released unfinished at worker shutdown; not counted as an attempt'
    FROM released
)
SELECT id, pg_notify('agora_jobs', queue) FROM released
"""

# Take back processing jobs whose lease expired: a failed attempt (retried at once while allowed).
RESCUE_EXPIRED = """
WITH lost AS (
    SELECT id, locked_by, lease_expires_at FROM agora.jobs
    WHERE status = 'processing' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT $2
    FOR UPDATE SKIP LOCKED
), rescued AS (
    UPDATE agora.jobs AS j
    SET status = 'failed', retry_count = j.retry_count + 1,
        max_retries = COALESCE(j.max_retries, $1),
        error_message = 'WorkerLost: worker ' || COALESCE(lost.locked_by, '?')
            || ' stopped renewing its lease, which expired at '
            || to_char(lost.lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
        run_at = now(), finished_at = now(), locked_by = NULL, lease_expires_at = NULL
    FROM lost WHERE j.id = lost.id
    RETURNING j.id, j.attempt, j.started_at, j.queue, j.error_message, lost.locked_by
), recorded AS (
    INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status, error_type, error_message)
    SELECT id, attempt, locked_by, started_at, now(), 'abandoned', 'WorkerLost', error_message FROM rescued
)
SELECT id, pg_notify('agora_jobs', queue) FROM rescued
"""

# -- workers -----------------------------------------------------------------

# Record a starting worker process.
INSERT_WORKER = """
INSERT INTO agora.workers (id, hostname, pid, queues) VALUES ($1, $2, $3, $4::text[])
"""

# Heartbeat: the worker is alive and its processing jobs keep their lease for $2 more seconds.
HEARTBEAT = """
WITH worker AS (
    UPDATE agora.workers SET last_heartbeat_at = now() WHERE id = $1
)
UPDATE agora.jobs SET lease_expires_at = now() + make_interval(secs => $2)
WHERE locked_by = $1 AND status = 'processing'
"""

# Record a clean stop.
STOP_WORKER = "UPDATE agora.workers SET stopped_at = now(), last_heartbeat_at = now() WHERE id = $1"

# Forget workers that have not been heard of for $1 seconds.
DELETE_STALE_WORKERS = """
DELETE FROM agora.workers WHERE last_heartbeat_at < now() - make_interval(secs => $1)
"""

# -- schema ------------------------------------------------------------------

# Whether the agora schema has ever been migrated.
VERSION_TABLE_EXISTS = "SELECT to_regclass('agora.alembic_version') IS NOT NULL"

# The applied migration revisions.
SELECT_SCHEMA_VERSIONS = "SELECT version_num FROM agora.alembic_version"
