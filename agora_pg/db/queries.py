"""Every SQL statement agora-pg runs, each with a one-line description.

Parameters are positional (``$1``) for asyncpg. JSON travels as text
(``$n::text::jsonb`` in, ``payload::text`` out) so that statements behave the
same whatever JSON codec a caller's connection has installed.
"""

from __future__ import annotations

from collections.abc import Sequence

from agora_pg.db.tables import ALIVE, CLAIMABLE

JOB_COLUMNS = (
    "id, name, kind, queue, status, payload::text AS payload, priority, run_at, retry_count, "
    "max_retries, error_message, dedup_key, created_at, started_at, finished_at, locked_by, "
    "lease_expires_at, attempt"
)
# What an insert returns: only what the database chose. Everything else is what the
# caller just sent (for 5,000-row batches, sending all 18 columns back and decoding
# them was a third of the time).
INSERTED_COLUMNS = "id, run_at, created_at, dedup_key"

# -- enqueue -----------------------------------------------------------------

# Insert one job.
INSERT_JOB = f"""
INSERT INTO agora.jobs (name, kind, queue, payload, priority, run_at, max_retries, dedup_key)
VALUES ($1, $2, $3, $4::text::jsonb, $5, COALESCE($6::timestamptz, now()), $7, $8)
RETURNING {INSERTED_COLUMNS}
"""

_INSERT_JOBS_FROM_DOCUMENT = """
INSERT INTO agora.jobs (name, kind, queue, payload, priority, run_at, max_retries, dedup_key)
SELECT name, kind, queue, payload, priority, COALESCE(run_at, now()), max_retries, dedup_key
FROM jsonb_to_recordset($1::text::jsonb)
     AS t(name text, kind text, queue text, payload jsonb, priority int, run_at timestamptz,
          max_retries int, dedup_key text)
"""

# Insert many jobs in one statement, from a JSON array of row objects (see
# job_spec.batch_document: one document instead of eight parameter arrays), in
# array order. Returns the ids in order and now(), which is every row's created_at
# and the run_at of rows given none: one row with an array decodes in a fraction of
# the time of 5,000 rows of timestamps.
INSERT_JOBS = f"""
WITH inserted AS ({_INSERT_JOBS_FROM_DOCUMENT} RETURNING id)
SELECT coalesce(array_agg(id ORDER BY id), '{{}}') AS ids, now() AS now FROM inserted
"""

# The same two, for jobs with a dedup_key: a live job with the same key makes a row
# insert nothing. Only used when a key is present: ON CONFLICT makes PostgreSQL
# insert speculatively, which costs every row an extra index probe and WAL record.
_ON_DEDUP_CONFLICT = f"ON CONFLICT (dedup_key) WHERE {ALIVE} DO NOTHING\nRETURNING"
INSERT_JOB_DEDUP = INSERT_JOB.replace("RETURNING", _ON_DEDUP_CONFLICT)
INSERT_JOBS_DEDUP = f"{_INSERT_JOBS_FROM_DOCUMENT}{_ON_DEDUP_CONFLICT} {INSERTED_COLUMNS}"

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

_CLAIM_UPDATE = f"""
UPDATE agora.jobs AS j
SET status = 'processing', started_at = now(), finished_at = NULL, locked_by = $3,
    lease_expires_at = now() + make_interval(secs => $4), attempt = j.attempt + 1
FROM next WHERE j.id = next.id
RETURNING {", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))}
"""

# Claim up to $2 due jobs of queue $1 for worker $3, with a lease of $4 seconds.
# `queue = $1` (not `= ANY(...)`) lets the scan read jobs_claimable_idx in its order
# and stop after $2 rows; with ANY, PostgreSQL fetches every due row and sorts them.
CLAIM_JOBS = f"""
WITH next AS (
    SELECT id FROM agora.jobs
    WHERE ({CLAIMABLE}) AND queue = $1 AND run_at <= now()
    ORDER BY priority DESC, run_at, id
    LIMIT $2
    FOR UPDATE SKIP LOCKED
)
{_CLAIM_UPDATE}"""

# The same for several queues $1 (text[]): each queue's best due jobs, read and locked
# in index order, then the best of those across queues. Rows locked but not chosen are
# released when the statement ends (other workers skip them for that long).
CLAIM_JOBS_FROM_QUEUES = f"""
WITH next AS (
    SELECT best.id FROM unnest($1::text[]) AS q(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at FROM agora.jobs
        WHERE ({CLAIMABLE}) AND queue = q.name AND run_at <= now()
        ORDER BY priority DESC, run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS best
    ORDER BY best.priority DESC, best.run_at, best.id
    LIMIT $2
)
{_CLAIM_UPDATE}"""

# The fence of every outcome is (id, attempt, locked_by = this worker): locked_by is set
# only while a job is processing and cleared by every way out of it. It is written that
# way rather than with status = 'processing' because that predicate matches the partial
# jobs_lease_idx, and with statistics taken while nothing ran the planner drove the join
# from that index, rescanning the id array per row (quadratic: 75 ms for 500 jobs).

# Mark attempts (id, attempt) done and record their runs; returns the ids that were still theirs.
COMPLETE_SUCCEEDED = """
WITH finished AS (
    UPDATE agora.jobs AS j
    SET status = 'done', finished_at = now(), locked_by = NULL, lease_expires_at = NULL
    FROM unnest($1::bigint[], $2::int[]) AS t(id, attempt)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.locked_by = $3
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
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.locked_by = $7
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
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.locked_by = $3
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
# Rows locked right now are being completed by the same worker: skipping them (instead of
# waiting) keeps the heartbeat from deadlocking with that completion.
HEARTBEAT = """
WITH worker AS (
    UPDATE agora.workers SET last_heartbeat_at = now() WHERE id = $1
), held AS (
    SELECT id FROM agora.jobs WHERE locked_by = $1 AND status = 'processing'
    ORDER BY id
    FOR UPDATE SKIP LOCKED
)
UPDATE agora.jobs AS j SET lease_expires_at = now() + make_interval(secs => $2)
FROM held WHERE j.id = held.id
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

# -- schedules -------------------------------------------------------------------

SCHEDULE_COLUMNS = (
    "pipeline_id, schedule_kind, schedule_spec, state, next_run_at, consecutive_errors, last_error, "
    "last_status, last_started_at, last_finished_at, lease_owner, lease_expires_at, "
    "error_backoff_seconds, max_consecutive_errors"
)

# Register a pipeline's schedule; a changed spec recomputes next_run_at (and re-arms a completed one).
UPSERT_SCHEDULE = f"""
INSERT INTO agora.schedules AS s
    (pipeline_id, schedule_kind, schedule_spec, next_run_at, error_backoff_seconds, max_consecutive_errors)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (pipeline_id) DO UPDATE SET
    schedule_kind = EXCLUDED.schedule_kind,
    schedule_spec = EXCLUDED.schedule_spec,
    next_run_at = CASE WHEN s.schedule_spec = EXCLUDED.schedule_spec THEN s.next_run_at
                       ELSE EXCLUDED.next_run_at END,
    state = CASE WHEN s.schedule_spec <> EXCLUDED.schedule_spec AND s.state = 'completed' THEN 'active'
                 ELSE s.state END,
    error_backoff_seconds = EXCLUDED.error_backoff_seconds,
    max_consecutive_errors = EXCLUDED.max_consecutive_errors,
    updated_at = now()
RETURNING {SCHEDULE_COLUMNS}
"""

# One schedule, with how many seconds (by the database clock) until it is due and until its lease expires.
SELECT_SCHEDULE = f"""
SELECT {SCHEDULE_COLUMNS},
       extract(epoch FROM next_run_at - clock_timestamp()) AS due_in_seconds,
       extract(epoch FROM lease_expires_at - clock_timestamp()) AS lease_left_seconds
FROM agora.schedules WHERE pipeline_id = $1
"""

# Claim the due run of pipeline $1 (registered with spec $3) for worker $2 with a lease of $4
# seconds. A lease left by a lost worker is taken over: its run is recorded abandoned and the
# tick is run again now. The run row's unique (pipeline_id, scheduled_for) key makes a second
# record of the same tick impossible.
CLAIM_PIPELINE_RUN = f"""
WITH due AS (
    SELECT pipeline_id, next_run_at, lease_owner FROM agora.schedules
    WHERE pipeline_id = $1 AND state = 'active' AND schedule_spec = $3
      AND next_run_at <= clock_timestamp()
      AND (lease_owner IS NULL OR lease_expires_at < clock_timestamp())
    FOR UPDATE SKIP LOCKED
), abandoned AS (
    UPDATE agora.runs AS r
    SET status = 'abandoned', finished_at = now(), error_type = 'WorkerLost',
        error_message = 'WorkerLost: worker ' || due.lease_owner || ' stopped renewing its lease'
    FROM due
    WHERE due.lease_owner IS NOT NULL AND r.pipeline_id = due.pipeline_id AND r.status = 'running'
), claimed AS (
    UPDATE agora.schedules AS s
    SET lease_owner = $2, lease_expires_at = clock_timestamp() + make_interval(secs => $4),
        last_started_at = clock_timestamp(),
        next_run_at = CASE WHEN due.lease_owner IS NULL THEN s.next_run_at ELSE clock_timestamp() END
    FROM due WHERE s.pipeline_id = due.pipeline_id
    RETURNING {", ".join("s." + c.strip() for c in SCHEDULE_COLUMNS.split(","))}
), run AS (
    INSERT INTO agora.runs (pipeline_id, attempt, worker_id, started_at, status, scheduled_for)
    SELECT pipeline_id, 1, $2, last_started_at, 'running', next_run_at FROM claimed
    RETURNING id, scheduled_for
)
SELECT claimed.*, run.id AS run_id, run.scheduled_for FROM claimed, run
"""

# Keep the lease of a running pipeline run.
RENEW_PIPELINE_LEASE = """
UPDATE agora.schedules SET lease_expires_at = clock_timestamp() + make_interval(secs => $3)
WHERE pipeline_id = $1 AND lease_owner = $2
"""

# Record the end of run $3 of pipeline $1 by worker $2 and the schedule's new state, fenced on the lease.
FINISH_PIPELINE_RUN = """
WITH released AS (
    UPDATE agora.schedules
    SET lease_owner = NULL, lease_expires_at = NULL, last_finished_at = clock_timestamp(),
        last_status = $4, consecutive_errors = $7, last_error = $6, next_run_at = $8,
        state = CASE WHEN state = 'paused' AND $9 = 'active' THEN 'paused' ELSE $9 END  -- paused meanwhile
    WHERE pipeline_id = $1 AND lease_owner = $2
    RETURNING pipeline_id
)
UPDATE agora.runs AS r
SET status = $4, finished_at = clock_timestamp(), error_type = $5, error_message = $6
FROM released
WHERE r.id = $3 AND r.status = 'running'
RETURNING r.id
"""

# Give back a run cut short at shutdown: recorded cancelled, the lease freed, due again at once.
RELEASE_PIPELINE_RUN = """
WITH released AS (
    UPDATE agora.schedules
    SET lease_owner = NULL, lease_expires_at = NULL, last_status = 'cancelled',
        next_run_at = CASE WHEN state = 'active' THEN clock_timestamp() ELSE next_run_at END
    WHERE pipeline_id = $1 AND lease_owner = $2
    RETURNING pipeline_id
)
UPDATE agora.runs AS r
SET status = 'cancelled', finished_at = clock_timestamp(), error_type = 'WorkerShutdown',
    error_message = 'WorkerShutdown: cancelled at worker shutdown'
FROM released
WHERE r.id = $3 AND r.status = 'running'
RETURNING r.id
"""

# Database liveness for the health server.
PING = "SELECT 1"

# -- listing and changing jobs, schedules and runs (the API and the operator CLI) ----

RUN_COLUMNS = (
    "id, job_id, pipeline_id, attempt, worker_id, started_at, finished_at, status, error_type, "
    "error_message, scheduled_for"
)

# Filters a job listing may combine: each compares one column with one parameter.
JOB_FILTERS = {"status": "status = {}", "kind": "kind = {}", "queue": "queue = {}", "before_id": "id < {}"}

# Filters a run listing may combine.
RUN_FILTERS = {
    "pipeline_id": "pipeline_id = {}",
    "job_id": "job_id = {}",
    "status": "status = {}",
    "since": "started_at >= {}",
    "until": "started_at < {}",
    "before_id": "id < {}",
}


def _where(fragments: dict[str, str], names: Sequence[str]) -> str:
    """``WHERE`` joining the fragments named (in that order, as parameters $1, $2, ...)."""
    if not names:
        return ""
    return "WHERE " + " AND ".join(fragments[name].format(f"${i}") for i, name in enumerate(names, 1))


def list_jobs(filters: Sequence[str]) -> str:
    """Jobs matching ``filters`` (names of ``JOB_FILTERS``, values passed in that order),
    newest first, at most the last parameter's number of rows."""
    return (
        f"SELECT {JOB_COLUMNS} FROM agora.jobs {_where(JOB_FILTERS, filters)} "
        f"ORDER BY id DESC LIMIT ${len(filters) + 1}"
    )


def list_runs(filters: Sequence[str]) -> str:
    """Runs matching ``filters`` (names of ``RUN_FILTERS``), newest first, at most the last parameter's rows."""
    return (
        f"SELECT {RUN_COLUMNS} FROM agora.runs {_where(RUN_FILTERS, filters)} "
        f"ORDER BY id DESC LIMIT ${len(filters) + 1}"
    )


# Every run of one job, oldest first.
SELECT_JOB_RUNS = f"SELECT {RUN_COLUMNS} FROM agora.runs WHERE job_id = $1 ORDER BY attempt, id"

# Give a failed or cancelled job another attempt now. retry_count keeps counting, so it
# retries on its own again only while retry_count < max_retries.
RETRY_JOB = f"""
UPDATE agora.jobs
SET status = 'pending', run_at = now(), finished_at = NULL, locked_by = NULL, lease_expires_at = NULL
WHERE id = $1 AND status IN ('failed', 'cancelled')
RETURNING {JOB_COLUMNS}
"""

# Every schedule, by pipeline id.
LIST_SCHEDULES = f"SELECT {SCHEDULE_COLUMNS} FROM agora.schedules ORDER BY pipeline_id"

# A changed schedule wakes the workers serving it (payload: the pipeline id).
SCHEDULES_CHANNEL = "agora_schedules"
_WAKE_SCHEDULE = f"pg_notify('{SCHEDULES_CHANNEL}', pipeline_id) AS woken"

# Pause schedule $1: no new run starts until it is resumed (a running one finishes).
PAUSE_SCHEDULE = f"""
UPDATE agora.schedules SET state = 'paused', updated_at = now()
WHERE pipeline_id = $1 AND state IN ('active', 'paused')
RETURNING {SCHEDULE_COLUMNS}
"""

# Resume schedule $1. A stopped one (too many consecutive errors) starts again now, with
# its error count reset; a paused one keeps its next_run_at (if that passed, it runs now, once).
RESUME_SCHEDULE = f"""
UPDATE agora.schedules
SET state = 'active', updated_at = now(),
    consecutive_errors = CASE WHEN state = 'stopped' THEN 0 ELSE consecutive_errors END,
    next_run_at = CASE WHEN state = 'stopped' THEN now() ELSE next_run_at END
WHERE pipeline_id = $1 AND state IN ('active', 'paused', 'stopped')
RETURNING {SCHEDULE_COLUMNS}, {_WAKE_SCHEDULE}
"""

# Make active, idle schedule $1 due now: it runs once at once, then on its schedule.
TRIGGER_SCHEDULE = f"""
UPDATE agora.schedules SET next_run_at = now(), updated_at = now()
WHERE pipeline_id = $1 AND state = 'active'
  AND (lease_owner IS NULL OR lease_expires_at < clock_timestamp())
RETURNING {SCHEDULE_COLUMNS}, {_WAKE_SCHEDULE}
"""

# -- metrics (each reads an index, not the whole history) --------------------------

# Live jobs (pending, processing, failed and waiting for a retry) by queue and status.
METRIC_LIVE_JOBS = f"""
SELECT queue, status, count(*) AS jobs FROM agora.jobs
WHERE ({CLAIMABLE}) OR status = 'processing'
GROUP BY queue, status
"""

# Per queue, seconds since the oldest due pending job became due.
METRIC_OLDEST_DUE = """
SELECT queue, extract(epoch FROM now() - min(run_at)) AS age_seconds FROM agora.jobs
WHERE status = 'pending' AND run_at <= now()
GROUP BY queue
"""

# Runs finished in the last $1 seconds, by outcome.
METRIC_RECENT_RUNS = """
SELECT status, count(*) AS runs FROM agora.runs
WHERE finished_at > now() - make_interval(secs => $1)
GROUP BY status
"""

# Schedules by state, and how many active ones are backing off after errors.
METRIC_SCHEDULES = """
SELECT state, count(*) AS schedules,
       count(*) FILTER (WHERE state = 'active' AND consecutive_errors > 0) AS in_backoff
FROM agora.schedules GROUP BY state
"""

# -- pipelines: checkpoints and dead letters ------------------------------------------

# Where pipeline $1's source resumes, and which source saved it.
SELECT_CHECKPOINT = "SELECT position::text AS position, source FROM agora.checkpoints WHERE pipeline_id = $1"

# Save pipeline $1's source position $2 (JSON) for source $3, by run $4.
SAVE_CHECKPOINT = """
INSERT INTO agora.checkpoints (pipeline_id, position, source, run_id, updated_at)
VALUES ($1, $2::text::jsonb, $3, $4, now())
ON CONFLICT (pipeline_id) DO UPDATE
SET position = EXCLUDED.position, source = EXCLUDED.source, run_id = EXCLUDED.run_id, updated_at = now()
"""

# Forget pipeline $1's position: its next run reads the source from the start.
DELETE_CHECKPOINT = "DELETE FROM agora.checkpoints WHERE pipeline_id = $1"

# Record rejected records of pipeline $1, run $2, from parallel arrays (stage, record JSON, error type, message).
INSERT_DEAD_LETTERS = """
INSERT INTO agora.dead_letters (pipeline_id, run_id, stage, record, error_type, error_message)
SELECT $1, $2, stage, record::jsonb, error_type, error_message
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS t(stage, record, error_type, error_message)
"""

DEAD_LETTER_COLUMNS = (
    "id, pipeline_id, run_id, stage, record::text AS record, error_type, error_message, created_at, replayed_at"
)

# Dead letters of pipeline $1 (all pipelines when NULL), waiting for replay unless $2, newest first, at most $3.
LIST_DEAD_LETTERS = f"""
SELECT {DEAD_LETTER_COLUMNS} FROM agora.dead_letters
WHERE ($1::text IS NULL OR pipeline_id = $1) AND ($2 OR replayed_at IS NULL)
ORDER BY id DESC LIMIT $3
"""

# Dead letters of pipeline $1 waiting for replay, oldest first, at most $2.
WAITING_DEAD_LETTERS = f"""
SELECT {DEAD_LETTER_COLUMNS} FROM agora.dead_letters
WHERE pipeline_id = $1 AND replayed_at IS NULL
ORDER BY id LIMIT $2
"""

# Mark dead letters replayed.
MARK_DEAD_LETTERS_REPLAYED = "UPDATE agora.dead_letters SET replayed_at = now() WHERE id = ANY($1::bigint[])"

# A pipeline run outside any schedule (agora-pg run, dlq replay): its agora.runs row.
START_ADHOC_RUN = """
INSERT INTO agora.runs (pipeline_id, attempt, worker_id, status, scheduled_for)
VALUES ($1, 1, $2, 'running', clock_timestamp())
RETURNING id
"""

# The end of such a run.
FINISH_ADHOC_RUN = """
UPDATE agora.runs SET status = $2, finished_at = clock_timestamp(), error_type = $3, error_message = $4
WHERE id = $1
"""


def quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL identifier (table and column names cannot be parameters)."""
    return '"' + name.replace('"', '""') + '"'


def insert_row(schema: str, table: str, columns: Sequence[str]) -> str:
    """Insert one row into a user's table, values as parameters $1, $2, ..."""
    names = ", ".join(quote_identifier(column) for column in columns)
    values = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    return f"INSERT INTO {quote_identifier(schema)}.{quote_identifier(table)} ({names}) VALUES ({values})"

# The columns of a user's table $1.$2, in order (for a DatabaseSink without explicit columns).
TABLE_COLUMNS = """
SELECT column_name FROM information_schema.columns
WHERE table_schema = $1 AND table_name = $2 AND is_generated = 'NEVER'
ORDER BY ordinal_position
"""
