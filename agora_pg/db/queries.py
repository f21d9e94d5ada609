"""Every SQL statement agora-pg runs, each with a one-line description.

Parameters are positional (``$1``) for asyncpg. JSON travels as text
(``$n::text::jsonb`` in, ``payload::text`` out) so that statements behave the
same whatever JSON codec a caller's connection has installed.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from agora_pg.jobs import JOB_FIELDS
from agora_pg.schedules import (ERROR_BACKOFF_CAP_SECONDS, SCHEDULE_DECLARED_EVERY_SECONDS,
                                SCHEDULE_ORPHANED_AFTER_SECONDS)

# A job is claimable in this state; the claim query and the partial index repeat it verbatim.
CLAIMABLE = "status = 'pending' OR (status = 'failed' AND retry_count < max_retries)"
# Claimable and not waiting for its run_at: the claim index holds exactly these rows (a
# delayed job enters it when a worker's promotion step sees its run_at pass).
CLAIMABLE_NOW = f"({CLAIMABLE}) AND NOT delayed"
# A job still has work ahead of it: at most one such job per dedup_key.
ALIVE = ("dedup_key IS NOT NULL AND (status IN ('pending', 'processing') "
         "OR (status = 'failed' AND retry_count < max_retries))")

# Every field of ``jobs.Job``, in its order (jsonb as text: decoded in Python).
JOB_COLUMNS = ", ".join(f"{name}::text AS {name}" if name in ("payload", "progress") else name for name in JOB_FIELDS)
# The same for reading a job: a running job's lease is its worker's
# (agora.workers.lease_expires_at) unless the job has one of its own.
JOB_READ_COLUMNS = JOB_COLUMNS.replace(
    "lease_expires_at,",
    "COALESCE(lease_expires_at, CASE WHEN status = 'processing' THEN "
    "(SELECT w.lease_expires_at FROM agora.workers AS w WHERE w.id = locked_by) END) AS lease_expires_at,",
)
# What an insert returns: only what the database chose (the kind's options among them).
# Everything else is what the caller just sent (for 5,000-row batches, sending all 18
# columns back and decoding them was a third of the time).
INSERTED_COLUMNS = "id, run_at, created_at, dedup_key, queue, max_retries, timeout_seconds"

# A scheduled pipeline's run is a job of the queue PIPELINE_QUEUE whose kind is the
# pipeline id and whose dedup key is PIPELINE_DEDUP_PREFIX + the pipeline id: at most one
# such job is alive per pipeline, which is how runs of a pipeline never overlap. What
# the statements read of it are its columns schedule_id, scheduled_for and run_plan
# (migration 0025), never its queue's name or its payload.
PIPELINE_QUEUE = "agora:pipelines"
PIPELINE_DEDUP_PREFIX = "pipeline:"
# A changed schedule (resumed, triggered, a run ended) wakes the schedulers serving it
# (payload: the pipeline id).
SCHEDULES_CHANNEL = "agora_schedules"


def _live_job_of(pipeline_id: str) -> str:
    """The live job (pending or running) of the pipeline whose id is the column
    ``pipeline_id`` of the row in scope, if any: a jobs_dedup_key_idx lookup."""
    return f"FROM agora.jobs AS j WHERE j.dedup_key = '{PIPELINE_DEDUP_PREFIX}' || {pipeline_id} AND {ALIVE}"


# -- enqueue -----------------------------------------------------------------

# Each insert wakes the workers itself, once per (queue, due now) of its new rows:
# agora_jobs with the queue for jobs due now, agora_delayed with '' for delayed ones
# (which wakes the workers' promotion step). PostgreSQL sends the identical
# notifications of one transaction once, at commit. (An insert trigger did this until
# migration 0014: it cost a one-job enqueue about a fifth of its server time.)
_WAKE = """
woken AS (SELECT pg_notify(CASE WHEN delayed THEN 'agora_delayed' ELSE 'agora_jobs' END,
                           CASE WHEN delayed THEN '' ELSE queue END)
          FROM (SELECT DISTINCT queue, delayed FROM inserted) AS new_rows)"""

# A job's fair_key (migration 0017): the value of its payload's field that its kind is
# shared by (kind_limits.fair_by, else limit_by), as agora.limit_key() stores a key (a long
# one shortened and hashed: migration 0027); NULL for a kind without one. The batch
# looks a row's kind up only when some kind has such a field (otherwise one InitPlan per
# statement and nothing per row).
_FAIR_KEY = ("(SELECT agora.limit_key({payload} ->> COALESCE(l.fair_by, l.limit_by)) FROM agora.kind_limits AS l "
             "WHERE l.kind = {kind})")
_SOME_KIND_KEYED = "(SELECT EXISTS (SELECT FROM agora.kind_limits WHERE COALESCE(fair_by, limit_by) IS NOT NULL))"

# A job's queue, max_retries and timeout_seconds: its own, else its kind's as declared
# (agora.kinds, joined as k; agora.enqueue() of migration 0026 does the same for SQL).
_KIND_OPTIONS = "COALESCE({queue}, k.queue, 'default'), COALESCE({max_retries}, k.max_retries), " \
                "COALESCE({timeout}, k.timeout_seconds)"

_INSERT_JOB_VALUES = f"""
INSERT INTO agora.jobs (name, kind, queue, max_retries, timeout_seconds, payload, priority, run_at, dedup_key,
                        delayed, fair_key)
SELECT $1::text, $2::text, {_KIND_OPTIONS.format(queue="$3::text", max_retries="$7::int", timeout="$9::float8")},
       $4::text::jsonb, $5::int, COALESCE($6::timestamptz, now()), $8::text,
       COALESCE($6::timestamptz, now()) > now(), {_FAIR_KEY.format(payload="$4::text::jsonb", kind="$2")}
FROM (SELECT) AS one LEFT JOIN agora.kinds AS k ON k.kind = $2
"""

_INSERT_JOBS_FROM_COLUMNS = f"""
INSERT INTO agora.jobs (name, kind, queue, max_retries, timeout_seconds, payload, priority, run_at, dedup_key,
                        delayed, fair_key)
SELECT COALESCE(name, t.kind), t.kind,
       {_KIND_OPTIONS.format(queue="t.queue", max_retries="t.max_retries", timeout="t.timeout_seconds")},
       payload, COALESCE(priority, 0), COALESCE(run_at, now()), dedup_key, COALESCE(run_at, now()) > now(),
       CASE WHEN {_SOME_KIND_KEYED} THEN {_FAIR_KEY.format(payload="t.payload", kind="t.kind")} END
FROM ROWS FROM (unnest($1::text[]), unnest($2::text[]), unnest($3::text[]), jsonb_array_elements($4::text::jsonb),
                unnest($5::int[]), unnest($6::timestamptz[]), unnest($7::int[]), unnest($8::text[]),
                unnest($9::float8[]))
     AS t(name, kind, queue, payload, priority, run_at, max_retries, dedup_key, timeout_seconds)
LEFT JOIN LATERAL (SELECT * FROM declared WHERE declared.kind = t.kind LIMIT 1) AS k ON true  -- (LIMIT: a nested
                                                                         -- loop, never a hash join, keeps the rows in order)
"""
# The batch's kinds as declared, read once (a lookup in agora.kinds per row cost a batch 7 %).
_DECLARED = "declared AS MATERIALIZED (SELECT * FROM agora.kinds WHERE kind = ANY($2::text[]))"

# The same two, for jobs with a dedup_key: a live job with the same key makes a row
# insert nothing. Only used when a key is present: ON CONFLICT makes PostgreSQL
# insert speculatively, which costs every row an extra index probe and WAL record.
_ON_DEDUP_CONFLICT = f"ON CONFLICT (dedup_key) WHERE {ALIVE} DO NOTHING\n"


def _returning_inserted(insert: str, before: str = "") -> str:
    """``insert`` (after the CTEs ``before``) returning INSERTED_COLUMNS of each new row, waking the workers."""
    return (f"WITH {before}inserted AS ({insert} RETURNING {INSERTED_COLUMNS}, delayed),{_WAKE}\n"
            f"SELECT {INSERTED_COLUMNS} FROM inserted WHERE (SELECT count(*) FROM woken) >= 0")


# Insert one job and return its id, run_at, created_at and dedup_key; a job due later
# is delayed (outside the claim index until promoted).
INSERT_JOB = _returning_inserted(_INSERT_JOB_VALUES)
INSERT_JOB_DEDUP = _returning_inserted(_INSERT_JOB_VALUES + _ON_DEDUP_CONFLICT)

# Insert many jobs in one statement, from one array per column (a NULL column: every row
# takes the default; see job_spec.batch_columns) and one JSON array of payloads, zipped
# by ROWS FROM, in array order. Returns the ids in order, their queues, max_retries and
# timeouts (their own or their kind's) and now(), which is every row's created_at and
# the run_at of rows given none: one row of arrays decodes in a fraction of the time of
# 5,000 rows of timestamps.
INSERT_JOBS = f"""
WITH {_DECLARED}, inserted AS ({_INSERT_JOBS_FROM_COLUMNS} RETURNING id, queue, delayed, max_retries, timeout_seconds),{_WAKE}
SELECT coalesce(array_agg(id ORDER BY id), '{{}}') AS ids, array_agg(queue ORDER BY id) AS queues,
       array_agg(max_retries ORDER BY id) AS max_retries, array_agg(timeout_seconds ORDER BY id) AS timeouts,
       now() AS now, (SELECT count(*) FROM woken) AS woken
FROM inserted
"""
INSERT_JOBS_DEDUP = _returning_inserted(_INSERT_JOBS_FROM_COLUMNS + _ON_DEDUP_CONFLICT, f"{_DECLARED}, ")

# The live jobs holding these dedup keys.
SELECT_ALIVE_BY_DEDUP_KEYS = f"""
SELECT {JOB_COLUMNS} FROM agora.jobs
WHERE dedup_key = ANY($1::text[]) AND {ALIVE}
"""

# -- testing (agora_pg.testing) ------------------------------------------------

# Work a worker of queues $1 has now: jobs running, or claimable and due ($2: the default
# max_retries of jobs that leave it unset).
COUNT_WORK_DUE_NOW = """
SELECT count(*) FROM agora.jobs
WHERE queue = ANY($1::text[])
  AND (status = 'processing'
       OR ((status = 'pending' OR (status = 'failed' AND retry_count < COALESCE(max_retries, $2)))
           AND run_at <= now()))
"""

# Jobs with an attempt that ended at or after $1, and the result of each one's succeeded
# attempt (JSON text), by job id.
JOBS_FINISHED_SINCE = f"""
SELECT {JOB_COLUMNS},
       (SELECT r.result::text FROM agora.runs AS r WHERE r.job_id = j.id AND r.status = 'succeeded'
        ORDER BY r.attempt DESC LIMIT 1) AS result
FROM agora.jobs AS j
WHERE j.id IN (SELECT job_id FROM agora.runs WHERE job_id IS NOT NULL AND finished_at >= $1)
ORDER BY j.id
"""

# -- reading and cancelling ----------------------------------------------------

# One job by id.
SELECT_JOB = f"SELECT {JOB_READ_COLUMNS} FROM agora.jobs WHERE id = $1"

def _planned_next_run(plan: str) -> str:
    """The next run a pipeline run's job planned (its ``run_plan``: ``next_at``, or
    ``next_in_seconds`` from now), never earlier than the next run of schedule ``s`` now;
    NULL when it planned none (a once schedule)."""
    return f"""CASE
            WHEN {plan} ? 'next_at' THEN GREATEST(s.next_run_at, ({plan}->>'next_at')::timestamptz)
            WHEN {plan} ? 'next_in_seconds' THEN GREATEST(s.next_run_at,
                now() + make_interval(secs => ({plan}->>'next_in_seconds')::float8))
            END"""


# Cancel job $1: one that has not started (pending, or failed and waiting for a retry)
# becomes cancelled; a running one is marked for its worker, which is woken on
# agora_cancel (payload: the job id) and stops the attempt (its renewal sees the mark too).
# A scheduled pipeline's run cancelled before it started skips its tick: the schedule
# moves on to the run after it, as after a success (none for a once schedule: it waits
# for a trigger), never backwards, and its schedulers are woken.
CANCEL_JOB = f"""
WITH waiting AS (
    UPDATE agora.jobs SET status = 'cancelled', finished_at = now(), delayed = false
    WHERE id = $1 AND ({CLAIMABLE})
    RETURNING {JOB_COLUMNS}, schedule_id, run_plan
), running AS (
    UPDATE agora.jobs SET cancel_requested_at = COALESCE(cancel_requested_at, now())
    WHERE id = $1 AND status = 'processing'
    RETURNING {JOB_COLUMNS}, pg_notify('{{cancel_channel}}', id::text) AS woken
), skipped AS (
    UPDATE agora.schedules AS s
    SET next_run_at = {_planned_next_run("w.run_plan")},
        updated_at = now()
    FROM waiting AS w
    WHERE s.pipeline_id = w.schedule_id AND s.schedule_spec = w.run_plan->>'spec'
    RETURNING pg_notify('{SCHEDULES_CHANNEL}', s.pipeline_id)
)
SELECT {JOB_COLUMNS} FROM waiting WHERE (SELECT count(*) FROM skipped) >= 0
UNION ALL
SELECT {JOB_COLUMNS} FROM running
"""

# -- claiming and finishing --------------------------------------------------

# A job claimed by a worker whose worker lease is live is covered by that lease (no lease
# of its own: the renewal then writes only the worker's row); a worker without one (its
# first renewal has not run, its lease passed, or it is of an earlier version) gives the
# job a lease of its own of $4 seconds, which the renewal folds into the worker's lease.
# (The subquery names no column of the row: it runs once per statement.)
_JOB_LEASE = """CASE WHEN (SELECT w.lease_expires_at FROM agora.workers AS w WHERE w.id = {worker}) > now() THEN NULL
                        ELSE now() + make_interval(secs => {seconds}) END"""


def _claim_update(worker: str, seconds: str, returning: str) -> str:
    """The UPDATE that claims the rows of the CTE ``next`` for the worker (parameter) ``worker``."""
    return f"""
UPDATE agora.jobs AS j
SET status = 'processing', started_at = now(), finished_at = NULL, locked_by = {worker},
    lease_expires_at = {_JOB_LEASE.format(worker=worker, seconds=seconds)}, attempt = j.attempt + 1,
    cancel_requested_at = NULL, progress = NULL
WHERE j.id = ANY(ARRAY(SELECT next.id FROM next))  -- (by the primary key, whatever the estimates)
RETURNING {returning}
"""


_CLAIMED_COLUMNS = ", ".join("j." + c.strip() for c in JOB_COLUMNS.split(","))

# Claim up to $2 due jobs of the queues $1 (text[]) and the kinds $7 (text[]: the kinds
# the worker handles; a job of another kind waits for a worker that handles it) for worker
# $3, with a lease of $4 seconds (see _JOB_LEASE); $5, $6: whether a job with lost attempts
# may be among them, and how many make a suspect (_SUSPECTS_IF_ALLOWED). Each (queue,
# kind)'s best due jobs are read and locked in jobs_claimable_idx's order, then the best of
# those across them are claimed; rows locked but not chosen are released when the
# statement ends (other workers skip them for that long). Jobs of kinds nobody here
# handles are never read, however many sit at the head of a queue. Delayed jobs are not in
# that index (PROMOTE_DUE_JOBS moves them in once due), so however many wait for later, a
# claim reads only rows it can take.
# A (queue, kind) with a limit is left to the limited claim below, whichever worker claims,
# even one that has not read the limit yet: kinds with a concurrency or rate limit or fair
# share (agora.kind_limits), and queues with limits (agora.queue_limits). Both tests name
# only the pair, not the row: PostgreSQL runs them once per pair, before any row is read.
_KIND_UNLIMITED = "NOT EXISTS (SELECT FROM agora.kind_limits WHERE kind = k.name)"
_QUEUE_UNLIMITED = "NOT EXISTS (SELECT FROM agora.queue_limits WHERE queue = q.name)"
# Jobs that lost $6 attempts or more are "suspects": one may be what kills workers, so a
# worker runs one at a time, and a job that kills its process takes the same neighbours
# down fewer times than it takes to fail them (the worker's threshold: one below
# WORKER_MAX_LOST_ATTEMPTS). $5 (boolean): whether this worker may take one now (it runs
# none). A claim takes at most one, the first in claim order; without $5 it reads past
# them. Either way the jobs behind a crowd of suspects still run, none given back.
_SUSPECTS_IF_ALLOWED = "(lost_count < $6 OR $5::boolean)"
_CLAIM_CTES = f"""taken AS (
    SELECT best.* FROM unnest($1::text[]) AS q(name) CROSS JOIN unnest($7::text[]) AS k(name)
    CROSS JOIN LATERAL (
        SELECT id, priority, run_at, lost_count FROM agora.jobs
        WHERE ({CLAIMABLE_NOW}) AND queue = q.name AND kind = k.name AND {_QUEUE_UNLIMITED} AND {_KIND_UNLIMITED}
          AND run_at <= now() AND {_SUSPECTS_IF_ALLOWED}
        ORDER BY priority DESC, run_at, id
        LIMIT $2
        FOR UPDATE SKIP LOCKED
    ) AS best
    ORDER BY best.priority DESC, best.run_at, best.id
    LIMIT $2
), next AS (
    SELECT id FROM taken
    WHERE lost_count < $6 OR id = (SELECT id FROM taken WHERE lost_count >= $6 ORDER BY priority DESC, run_at, id LIMIT 1)
)"""
CLAIM_JOBS = f"WITH {_CLAIM_CTES}{_claim_update('$3', '$4', _CLAIMED_COLUMNS)}"

# -- flow control ----------------------------------------------------------------
#
# Jobs a limit applies to (of a limited kind, in any queue, or of any kind in a limited
# queue) are claimed by agora.claim_limited_jobs (migrations 0029, 0030): one call that never
# waits on a lock. It takes a transaction-scoped advisory lock on each limited kind and
# queue of the worker's, leaving out those another claim holds; with a snapshot taken
# after them it counts the room of the kinds near a limit (by key for a per-key limit)
# and of the queues, and claims what fits in one statement, stamping started_at and the
# starts a rate counts with its clock, read after that snapshot. $1 the worker's queues
# (text[]), $2 the kinds it handles (text[]), $3 how many due jobs of a kind taken key by
# key to look at per queue for jobs without a key, $4 the most to claim, $5 the worker,
# $6 its lease seconds (as CLAIM_JOBS's), $7 the last key of fair share the worker served
# (keys are visited from the next one on); each job comes with its fair_key. A worker
# cancels a claim that has not answered within its WORKER_CLAIM_TIMEOUT.
CLAIM_LIMITED_JOBS = f"""
SELECT {JOB_COLUMNS}, fair_key FROM agora.claim_limited_jobs($1::text[], $2::text[], $3, $4, $5, $6, $7)
"""

# Declare the flow control of kinds ($1 kinds, $2 concurrency, $3 limit_by, $4 rate, $5
# rate_seconds, $6 fair_by; NULL: none) where $7 says: 'code' (a worker, for the kinds
# it handles) or 'config' (an agora/v1 [kinds] table). The row is written, a kind with
# none of them has its row deleted; a code declaration leaves a config row alone (the
# operator's config wins), a config declaration overwrites a code row.
DECLARE_KIND_LIMITS = """
WITH declared AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::float8[], $6::text[])
        AS d(kind, concurrency, limit_by, rate, rate_seconds, fair_by)
), removed AS (
    DELETE FROM agora.kind_limits AS l USING declared AS d
    WHERE l.kind = d.kind AND d.concurrency IS NULL AND d.rate IS NULL AND d.fair_by IS NULL
      AND (l.declared_in = 'code' OR $7::text = 'config')
)
INSERT INTO agora.kind_limits AS l (kind, concurrency, limit_by, rate, rate_seconds, fair_by, declared_in)
SELECT kind, concurrency, limit_by, rate, rate_seconds, fair_by, $7::text FROM declared
WHERE concurrency IS NOT NULL OR rate IS NOT NULL OR fair_by IS NOT NULL
ON CONFLICT (kind) DO UPDATE SET concurrency = EXCLUDED.concurrency, limit_by = EXCLUDED.limit_by,
    rate = EXCLUDED.rate, rate_seconds = EXCLUDED.rate_seconds, fair_by = EXCLUDED.fair_by,
    declared_in = EXCLUDED.declared_in, updated_at = now()
    WHERE (l.declared_in = 'code' OR EXCLUDED.declared_in = 'config')
      AND (l.concurrency, l.limit_by, l.rate, l.rate_seconds, l.fair_by, l.declared_in)
        IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.limit_by, EXCLUDED.rate, EXCLUDED.rate_seconds,
                          EXCLUDED.fair_by, EXCLUDED.declared_in)
"""

# A config's [kinds] table no longer lists these config-declared kinds: their rows go
# (the next start of a worker that handles one declares the code's limits again; a
# running one does so within LIMITS_REFRESH_SECONDS). $1: the kinds the config lists.
RELEASE_CONFIG_LIMITS = """
DELETE FROM agora.kind_limits WHERE declared_in = 'config' AND NOT kind = ANY($1::text[]) RETURNING kind
"""

# -- limited queues ------------------------------------------------------------

# Declare the limits of queues $1 (text[]; $2 concurrency int[], $3 rate int[], $4
# rate_seconds float8[]; NULL: none) where $5 says ('code': a worker, for the queues it
# claims; 'config': an agora/v1 [queues] table), with DECLARE_KIND_LIMITS's rules: a
# queue with none has its row deleted, a code declaration leaves a config row alone.
DECLARE_QUEUE_LIMITS = """
WITH declared AS (
    SELECT * FROM unnest($1::text[], $2::int[], $3::int[], $4::float8[]) AS d(queue, concurrency, rate, rate_seconds)
), removed AS (
    DELETE FROM agora.queue_limits AS l USING declared AS d
    WHERE l.queue = d.queue AND d.concurrency IS NULL AND d.rate IS NULL
      AND (l.declared_in = 'code' OR $5::text = 'config')
)
INSERT INTO agora.queue_limits AS l (queue, concurrency, rate, rate_seconds, declared_in)
SELECT queue, concurrency, rate, rate_seconds, $5::text FROM declared
WHERE concurrency IS NOT NULL OR rate IS NOT NULL
ON CONFLICT (queue) DO UPDATE SET concurrency = EXCLUDED.concurrency, rate = EXCLUDED.rate,
    rate_seconds = EXCLUDED.rate_seconds, declared_in = EXCLUDED.declared_in, updated_at = now()
    WHERE (l.declared_in = 'code' OR EXCLUDED.declared_in = 'config')
      AND (l.concurrency, l.rate, l.rate_seconds, l.declared_in)
          IS DISTINCT FROM (EXCLUDED.concurrency, EXCLUDED.rate, EXCLUDED.rate_seconds, EXCLUDED.declared_in)
"""

# A config's [queues] table no longer lists these config-declared queues ($1: those it lists).
RELEASE_CONFIG_QUEUE_LIMITS = """
DELETE FROM agora.queue_limits WHERE declared_in = 'config' AND NOT queue = ANY($1::text[]) RETURNING queue
"""

# The limited queues among $1 (text[]; NULL: every one) and their limits.
LIMITED_QUEUES = ("SELECT queue, concurrency, rate, rate_seconds FROM agora.queue_limits "
                  "WHERE $1::text[] IS NULL OR queue = ANY($1::text[]) ORDER BY queue")

# Give the waiting jobs of kinds $1 (text[]) the fair_key their kind's declaration asks
# for (jobs inserted before it was declared, or under another key field). Rows are locked
# in id order, skipping those a claim holds, so two workers starting at once never wait
# for each other.
KEY_WAITING_JOBS = """
WITH keyed AS (
    SELECT j.id, agora.limit_key(j.payload ->> COALESCE(l.fair_by, l.limit_by)) AS fair_key
    FROM agora.jobs AS j JOIN agora.kind_limits AS l ON l.kind = j.kind
    WHERE j.kind = ANY($1::text[]) AND (j.status = 'pending' OR (j.status = 'failed' AND j.retry_count < j.max_retries))
      AND j.fair_key IS DISTINCT FROM agora.limit_key(j.payload ->> COALESCE(l.fair_by, l.limit_by))
    ORDER BY j.id
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE agora.jobs AS j SET fair_key = keyed.fair_key FROM keyed WHERE j.id = keyed.id
"""

# Seconds until the earliest start counted by the rate limits of kinds $1 (text[]) or of
# queues $2 (text[]) leaves its window, when some key or queue may start a job again
# (NULL: no start is counted).
NEXT_RATE_ROOM = """
SELECT min(leaves_in)::float8 FROM (
    SELECT extract(epoch FROM s.started_at + make_interval(secs => l.rate_seconds) - now()) AS leaves_in
    FROM agora.kind_starts AS s JOIN agora.kind_limits AS l ON l.kind = s.kind
    WHERE s.kind = ANY($1::text[]) AND s.started_at > now() - make_interval(secs => l.rate_seconds)
    UNION ALL
    SELECT extract(epoch FROM s.started_at + make_interval(secs => l.rate_seconds) - now())
    FROM agora.queue_starts AS s JOIN agora.queue_limits AS l ON l.queue = s.queue
    WHERE s.queue = ANY($2::text[]) AND l.rate IS NOT NULL
      AND s.started_at > now() - make_interval(secs => l.rate_seconds)
) AS starts
"""

# The limited kinds among $1 (text[]), and whether each has a rate limit.
LIMITED_KINDS = "SELECT kind, rate IS NOT NULL AS rated FROM agora.kind_limits WHERE kind = ANY($1::text[])"

# Promote up to $1 delayed jobs whose run_at has passed into the claim index, waking the
# workers of their queues. Returns how many, and the seconds until the next delayed job
# falls due (NULL: none waits), by the database's clock. Every worker runs it; rows
# another worker is promoting are skipped.
PROMOTE_DUE_JOBS = """
WITH due AS (
    SELECT id FROM agora.jobs
    WHERE delayed AND run_at <= now()
    ORDER BY run_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), promoted AS (
    UPDATE agora.jobs AS j SET delayed = false FROM due WHERE j.id = due.id
    RETURNING j.queue
)
SELECT (SELECT count(*) FROM promoted) AS promoted,
       (SELECT count(pg_notify('agora_jobs', queue)) FROM (SELECT DISTINCT queue FROM promoted) AS q) AS woken,
       extract(epoch FROM (SELECT min(run_at) FROM agora.jobs WHERE delayed AND run_at > now()) - now())::float8
           AS next_in_seconds
"""

# An enqueue inserted delayed jobs (its statement's notification; payload ''): the promotion
# steps look again at when the earliest falls due.
DELAYED_CHANNEL = "agora_delayed"

# A job given back without being run is due again, unless a cancel of it was acknowledged
# meanwhile: then it is cancelled (the claim that takes it next would forget the cancel).
_GIVEN_BACK = ("status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE 'pending' END, "
               "finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL THEN now() ELSE j.finished_at END")

def _given_back(where: str) -> str:
    """Give back the jobs of worker $1 that ``where`` picks: pending again at once,
    nothing counted or recorded; their queues' workers are woken."""
    return f"""
WITH released AS (
    UPDATE agora.jobs AS j SET {_GIVEN_BACK}, locked_by = NULL, lease_expires_at = NULL
    WHERE j.locked_by = $1 AND {where}
    RETURNING j.id, j.queue
)
SELECT id, pg_notify('agora_jobs', queue) FROM released
"""


# Attempts (id, attempt) it claimed but will not start (a worker runs one job with lost
# attempts at a time, so that a job that kills its process never takes the same
# neighbours down twice; the others it claimed along go back).
RELEASE_CLAIMED_JOBS = _given_back("(j.id, j.attempt) IN (SELECT * FROM unnest($2::bigint[], $3::int[]))")
# Every job it holds but never started (a claim whose reply was lost, or jobs left at
# shutdown), but those still running in a thread ($2).
RELEASE_UNSTARTED_JOBS = _given_back("j.status = 'processing' AND NOT (j.id = ANY($2::bigint[]))")

# The fence of every outcome is (id, attempt, locked_by = this worker): locked_by is set
# only while a job is processing and cleared by every way out of it. It is written that
# way rather than with status = 'processing' because that predicate matches the partial
# indexes of running jobs (jobs_locked_by_idx, jobs_lease_idx), and with statistics taken
# while nothing ran the planner drove the join from such an index, rescanning the id
# array per row (quadratic: 75 ms for 500 jobs).

# An attempt of a schedule's job ended: its schedule row is updated from the row as it is
# now, not as it was when the run began. The CTE "ended" has the job's schedule_id,
# run_plan (a pipeline's run: the spec it was enqueued under and its next run after a
# success), status, started_at, the run's status and error, whether the run was cut short
# at shutdown (released: due again at once, not counted) and when it ended (a lost run:
# when its worker was last heard of, its lease's last renewal). A periodic job's attempt
# (no run plan; its tick moved the schedule on) sets the schedule's last run only, as a
# pipeline's run does, which also moves the schedule on. A failed or abandoned run
# counts: the next run waits min(600, error_backoff_seconds * 2^(n-1)) after the n-th in a
# row from its end (schedules.error_backoff; a lost run's wait for its lease counts) and the schedule stops at max_consecutive_errors; a success
# resets the count and sets the next run the plan names (none: a once schedule,
# completed). The next run is never earlier than the schedule's next run now: a run retried
# by hand long after its tick (its plan's next run is stale) never moves the schedule
# backwards. A spec changed meanwhile (registered again) keeps the next run and state the
# registration set; a schedule paused or stopped meanwhile keeps its state. Runs outside a
# schedule (no spec in the plan) change no schedule. The schedulers are woken.
_PIPELINE_RUN_ENDED = f"""scheduled AS (
    UPDATE agora.schedules AS s
    SET last_started_at = e.started_at, last_finished_at = now(), last_status = e.run_status,
        last_error = e.error_message, updated_at = now(),
        consecutive_errors = CASE WHEN e.run_plan IS NULL THEN s.consecutive_errors
                                  WHEN e.run_status IN ('failed', 'abandoned') THEN s.consecutive_errors + 1
                                  WHEN e.run_status = 'succeeded' THEN 0 ELSE s.consecutive_errors END,
        next_run_at = CASE
            WHEN s.schedule_spec IS DISTINCT FROM e.run_plan->>'spec' THEN s.next_run_at
            WHEN e.run_status IN ('failed', 'abandoned') THEN GREATEST(s.next_run_at, now(), e.ended_at + make_interval(
                secs => LEAST({ERROR_BACKOFF_CAP_SECONDS}, s.error_backoff_seconds * power(2, LEAST(s.consecutive_errors, 62)))))
            WHEN e.released THEN now()
            WHEN e.run_plan ?| array['next_at', 'next_in_seconds'] THEN {_planned_next_run("e.run_plan")}
            ELSE s.next_run_at END,
        state = CASE
            WHEN s.schedule_spec IS DISTINCT FROM e.run_plan->>'spec' OR s.state <> 'active' THEN s.state
            WHEN e.run_status IN ('failed', 'abandoned') AND s.consecutive_errors + 1 >= s.max_consecutive_errors
                THEN 'stopped'
            WHEN e.run_status = 'succeeded' AND NOT e.run_plan ?| array['next_at', 'next_in_seconds']
                THEN 'completed'
            ELSE s.state END
    FROM ended AS e
    WHERE s.pipeline_id = e.schedule_id AND e.status <> 'pending' AND (e.run_plan IS NULL OR e.run_plan ? 'spec')
    RETURNING pg_notify('{SCHEDULES_CHANNEL}', s.pipeline_id)
)"""

# What a finished job returns of its schedule (each attempt's run names the schedule and tick).
_SCHEDULE_COLUMNS = "j.schedule_id, j.scheduled_for, j.run_plan"
# A job's max_retries: its own, else its kind's (a job inserted by plain SQL, or before any
# worker declared its kind, takes it at its first failure), else the worker's default.
_MAX_RETRIES = "COALESCE(j.max_retries, (SELECT d.max_retries FROM agora.kinds AS d WHERE d.kind = j.kind), {default})"
# A pipeline's run has one attempt: its schedule, not the job, decides what comes after
# it (a lost or released run is not taken again: the schedule's next run is the scheduler's).
_ONE_ATTEMPT = "j.run_plan IS NOT NULL"

# Mark attempts (id, attempt) done (a done job shows no error: its failed attempts' runs
# keep theirs) and record their runs (with the attempt's last progress
# report and the handler's result, JSON text or NULL); returns the ids that were still
# theirs, and wakes the event streams (one notification per statement: PostgreSQL folds
# identical ones of a transaction).
_COMPLETE_CTES = f"""finished AS (
    UPDATE agora.jobs AS j
    SET status = 'done', finished_at = now(), locked_by = NULL, lease_expires_at = NULL,
        cancel_requested_at = NULL, error_message = NULL  -- (earlier attempts' errors stay in their runs)
    FROM unnest($1::bigint[], $2::int[], $4::text[]) AS t(id, attempt, result)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.locked_by = $3
    RETURNING j.id, j.attempt, j.started_at, j.progress, t.result, j.status, {_SCHEDULE_COLUMNS}
), recorded AS (
    INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status, progress, result,
                            pipeline_id, scheduled_for)
    SELECT id, attempt, $3, started_at, now(), 'succeeded', progress, result::jsonb, schedule_id, scheduled_for
    FROM finished
    RETURNING job_id
), ended AS (
    SELECT schedule_id, run_plan, status, started_at, 'succeeded' AS run_status, NULL AS error_message,
           false AS released, now() AS ended_at
    FROM finished
), {_PIPELINE_RUN_ENDED}"""
_WAKE_EVENTS = "(SELECT pg_notify('agora_events', '')) AS events_woken, (SELECT count(*) FROM scheduled) AS schedules_woken"
COMPLETE_SUCCEEDED = f"WITH {_COMPLETE_CTES}\nSELECT job_id, {_WAKE_EVENTS} FROM recorded"


def _renumbered(sql: str, numbers: Sequence[int]) -> str:
    """``sql`` with its parameter $n written ${numbers[n - 1]}."""
    return re.sub(r"\$(\d+)", lambda match: f"${numbers[int(match.group(1)) - 1]}", sql)


# COMPLETE_SUCCEEDED, then CLAIM_JOBS, in one call: one round trip and one commit for a
# batch's successes and the worker's next batch (the rows they touch are apart: one set
# held by the worker, the other claimable). It is the PL/pgSQL function
# agora.complete_and_claim, which migrations create from this text (a test holds the
# latest one to it), so that its plans are made once per session: as one statement,
# planned at each call, the two cost more than the commit they save. Those plans are
# generic (made before any argument is known) and never sequential scans: a plan made
# while the table was empty or its statistics stale would otherwise scan the jobs at
# every call for the rest of the session. No estimate can make them compile (JIT). Its
# arguments are COMPLETE_SUCCEEDED's $1-$4, then CLAIM_JOBS's $1, $2, $4, $5, $6 and $7
# as $5-$10 ($3, the worker, is both's). Rows: (job id, NULL) for each outcome recorded,
# then (NULL, the job) for each job claimed. Either both commit or neither does.
COMPLETE_AND_CLAIM_FUNCTION = f"""CREATE OR REPLACE FUNCTION agora.complete_and_claim(
    bigint[], integer[], text, text[], text[], integer, double precision, boolean, integer, text[]
) RETURNS TABLE (recorded_id bigint, job agora.jobs) LANGUAGE plpgsql VOLATILE
SET jit = off SET plan_cache_mode = force_generic_plan SET enable_seqscan = off AS $function$
BEGIN
    IF cardinality($1) > 0 THEN
        RETURN QUERY WITH {_COMPLETE_CTES}
        SELECT r.job_id, NULL::agora.jobs FROM recorded AS r, (SELECT {_WAKE_EVENTS}) AS woken;
    END IF;
    IF $6 > 0 THEN
        RETURN QUERY WITH {_renumbered(_CLAIM_CTES, [5, 6, 3, 7, 8, 9, 10])}, claimed AS ({_claim_update("$3", "$7", "j.*")})
        SELECT NULL::bigint, claimed::agora.jobs FROM claimed;
    END IF;
END
$function$"""
COMPLETE_AND_CLAIM = "SELECT recorded_id, job FROM agora.complete_and_claim($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)"

# Record every outcome but success of the attempts in the CTE "outcome" (id, attempt,
# worker_id: the worker that held it, kind: outcomes.OutcomeKind, error_type,
# error_message, traceback, delay, final, ended_at):
#   failed:    retry_count + 1, due again after delay (delayed until then; a final failure caps
#              max_retries at the failures so far, so nothing claims it again);
#   cancelled: cancelled on request, never retried;
#   lost, released: lost_count + 1 and due again at once, until lost_count reaches $2
#              (WORKER_MAX_LOST_ATTEMPTS): then failed for good (a pipeline's run at once:
#              _ONE_ATTEMPT). A lost attempt of a job whose cancel was asked is cancelled.
# $3 is the default max_retries. Jobs due again at once wake the workers of their queue;
# retries that wait wake the workers' promotion steps (agora_delayed).
def _finishing(outcome: str) -> str:
    return f"""
WITH outcome AS ({outcome}), finished AS (
    UPDATE agora.jobs AS j
    SET status = CASE
            WHEN o.kind = 'cancelled' OR j.cancel_requested_at IS NOT NULL THEN 'cancelled'  -- (an acknowledged cancel holds)
            WHEN o.kind = 'failed' THEN 'failed'
            WHEN {_ONE_ATTEMPT} THEN CASE o.kind WHEN 'lost' THEN 'failed' ELSE 'cancelled' END
            WHEN j.lost_count + 1 >= $2 THEN 'failed'
            ELSE 'pending' END,
        retry_count = j.retry_count + (o.kind = 'failed')::int,
        lost_count = j.lost_count + (o.kind IN ('lost', 'released'))::int,
        max_retries = CASE
            WHEN o.final OR {_ONE_ATTEMPT} OR (o.kind IN ('lost', 'released') AND j.lost_count + 1 >= $2)
                THEN LEAST({_MAX_RETRIES.format(default="$3")}, j.retry_count + (o.kind = 'failed')::int)
            ELSE {_MAX_RETRIES.format(default="$3")} END,
        error_message = CASE
            WHEN o.kind IN ('lost', 'released') AND j.lost_count + 1 >= $2 AND NOT {_ONE_ATTEMPT}
                THEN o.error_message || ' (' || (j.lost_count + 1) || ' lost attempts: not retried)'
            ELSE o.error_message END,
        run_at = now() + make_interval(secs => o.delay), finished_at = now(),
        delayed = o.kind = 'failed' AND o.delay > 0 AND NOT o.final AND j.cancel_requested_at IS NULL
                  AND j.retry_count + 1 < {_MAX_RETRIES.format(default="$3")},
        locked_by = NULL, lease_expires_at = NULL, cancel_requested_at = NULL
    FROM outcome AS o
    WHERE j.id = o.id AND j.attempt = o.attempt AND j.locked_by = o.worker_id
    RETURNING j.id, j.attempt, j.started_at, j.queue, j.status, j.delayed, j.progress, j.error_message, o.worker_id,
              o.error_type, o.traceback, o.kind = 'released' AS released, o.ended_at, {_SCHEDULE_COLUMNS},
              CASE WHEN o.kind = 'failed' THEN 'failed' WHEN o.kind = 'lost' AND j.status <> 'cancelled' THEN 'abandoned'
                   ELSE 'cancelled' END AS run_status
), recorded AS (
    INSERT INTO agora.runs (job_id, attempt, worker_id, started_at, finished_at, status, error_type,
                            error_message, traceback, progress, pipeline_id, scheduled_for)
    SELECT id, attempt, worker_id, started_at, now(), run_status, error_type, error_message, traceback, progress,
           schedule_id, scheduled_for
    FROM finished
), ended AS (SELECT * FROM finished), {_PIPELINE_RUN_ENDED}
SELECT id, CASE WHEN status = 'pending' THEN pg_notify('agora_jobs', queue) END AS woken,
       (SELECT pg_notify('agora_events', '')) AS events_woken,
       CASE WHEN delayed THEN pg_notify('agora_delayed', '') END AS promoters_woken,
       (SELECT count(*) FROM scheduled) AS schedules_woken
FROM finished
"""


# The outcomes worker $1 sends (the arrays $4-$11).
FINISH_JOBS = _finishing("""
    SELECT t.*, $1::text AS worker_id, now() AS ended_at
    FROM unnest($4::bigint[], $5::int[], $6::text[], $7::text[], $8::text[], $9::text[], $10::float8[], $11::bool[])
        AS t(id, attempt, kind, error_type, error_message, traceback, delay, final)""")

# Worker $1 takes up the jobs it holds without knowing it ($2: the ids it knows): a claim
# that committed but whose reply was lost. Their lease becomes the worker's, or one of
# their own of $3 seconds (as a claim's).
ADOPT_UNKNOWN_JOBS = f"""
UPDATE agora.jobs AS j SET lease_expires_at = {_JOB_LEASE.format(worker="$1", seconds="$3")}
WHERE j.locked_by = $1 AND j.status = 'processing' AND NOT (j.id = ANY($2::bigint[]))
RETURNING {JOB_COLUMNS}
"""

# Take back processing jobs whose lease passed: the jobs of workers whose worker lease
# passed, and jobs with a lease of their own that passed (up to $1 of each). Each is a lost
# attempt (_finishing: $2 WORKER_MAX_LOST_ATTEMPTS, $3 the default max_retries) that ended
# when its worker was last heard of ($4: the lease's length, counted back from its expiry).
# A worker's jobs are looked up per worker whose lease passed (a nested loop over
# jobs_locked_by_idx, never a scan of every running job). The worker's row is locked too
# (shared: rescuers do not exclude each other), so a renewal in flight is not overtaken:
# the worker is skipped, or its row is read again as renewed.
RESCUE_EXPIRED = _finishing("""
    WITH lost_with_worker AS (
        SELECT j.*, w.id AS locked_by, w.lease_expires_at
        FROM agora.workers AS w
        CROSS JOIN LATERAL (
            SELECT id, attempt, cancel_requested_at FROM agora.jobs
            WHERE locked_by = w.id AND status = 'processing' AND lease_expires_at IS NULL
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        ) AS j
        WHERE w.lease_expires_at < now()
        LIMIT $1
        FOR SHARE OF w SKIP LOCKED
    ), lost_on_their_own AS (
        SELECT id, attempt, cancel_requested_at, locked_by, lease_expires_at FROM agora.jobs
        WHERE status = 'processing' AND lease_expires_at < now()
        ORDER BY lease_expires_at
        LIMIT $1
        FOR UPDATE SKIP LOCKED
    ), lost AS (SELECT * FROM lost_with_worker UNION ALL SELECT * FROM lost_on_their_own)
    SELECT id, attempt, locked_by AS worker_id, 'lost' AS kind,
           CASE WHEN cancel_requested_at IS NOT NULL THEN 'JobCancelled' ELSE 'WorkerLost' END AS error_type,
           CASE WHEN cancel_requested_at IS NOT NULL THEN 'JobCancelled: cancelled on request; ' ELSE '' END
               || 'WorkerLost: worker ' || locked_by || ' stopped renewing its lease, which expired at '
               || to_char(lease_expires_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"') AS error_message,
           NULL AS traceback, 0.0::float8 AS delay, false AS final,
           LEAST(now(), lease_expires_at - make_interval(secs => $4)) AS ended_at  -- (last heard of)
    FROM lost""")

# -- workers -----------------------------------------------------------------

# A worker process's counters and histograms so far, locked: what it counted since is added.
TALLIES_FOR_UPDATE = "SELECT tallies::text AS tallies FROM agora.process_tallies WHERE process_id = $1 FOR UPDATE"

# A worker process's counters and histograms (a JSON snapshot), replacing its last ones.
PUBLISH_TALLIES = """
INSERT INTO agora.process_tallies (process_id, tallies) VALUES ($1, $2::jsonb)
ON CONFLICT (process_id) DO UPDATE SET tallies = EXCLUDED.tallies, published_at = now()
"""

# Every process's snapshot (the retired sum included), for the API's /metrics.
ALL_TALLIES = "SELECT tallies::text AS tallies FROM agora.process_tallies ORDER BY process_id"

# Whether a process has been silent for $1 seconds (its tallies are to be retired).
ANY_SILENT_TALLIES = """
SELECT EXISTS (SELECT FROM agora.process_tallies
               WHERE process_id <> $2 AND published_at < now() - make_interval(secs => $1))
"""

# The tallies of processes silent for $1 seconds and the retired sum ($2), locked: they
# are folded into the sum and deleted in the same transaction.
SILENT_TALLIES_FOR_UPDATE = """
SELECT process_id, tallies::text AS tallies FROM agora.process_tallies
WHERE process_id = $2 OR published_at < now() - make_interval(secs => $1)
ORDER BY process_id
FOR UPDATE
"""

DELETE_TALLIES = "DELETE FROM agora.process_tallies WHERE process_id = ANY($1::text[])"


# Record a starting worker process ($4: the queues it claims).
INSERT_WORKER = """
INSERT INTO agora.workers (id, hostname, pid, queues, kinds) VALUES ($1, $2, $3, $4::text[], $5::text[])
ON CONFLICT (id) DO UPDATE SET queues = EXCLUDED.queues, kinds = EXCLUDED.kinds
"""


def _live_worker(alias: str, seconds: str) -> str:
    """Worker ``alias`` is live: a heartbeat in the last ``seconds`` (a parameter), not stopped."""
    return f"{alias}.stopped_at IS NULL AND {alias}.last_heartbeat_at > now() - make_interval(secs => {seconds})"


# Whether a live worker (a heartbeat in the last $3 seconds, not stopped) handles kind $1
# on queue $2 (one that does not say which kinds it handles counts), and the kinds the
# live workers of that queue handle.
LIVE_HANDLERS_OF = f"""
SELECT coalesce(bool_or(w.kinds IS NULL OR $1 = ANY(w.kinds)), false) AS handled,
       ARRAY(SELECT DISTINCT k FROM agora.workers AS v, unnest(v.kinds) AS k
             WHERE {_live_worker("v", "$3")} AND $2 = ANY(v.queues) ORDER BY k) AS kinds
FROM agora.workers AS w
WHERE {_live_worker("w", "$3")} AND $2 = ANY(w.queues)
"""


# Claimable jobs that no live worker handles (of their queue, their kind; one that does not
# say which kinds it handles, of an earlier version, counts) wait for one: by queue and
# kind, how many and since when the oldest is due. The (queue, kind) pairs with claimable
# jobs come from a skip scan of jobs_claimable_idx (one descent per pair), and only the
# jobs of pairs nobody handles are counted.
UNHANDLED_JOBS = f"""
WITH RECURSIVE pairs AS (
    (SELECT queue, kind FROM agora.jobs WHERE {CLAIMABLE_NOW} ORDER BY queue, kind LIMIT 1)
    UNION ALL
    SELECT next.queue, next.kind FROM pairs AS p CROSS JOIN LATERAL (
        SELECT queue, kind FROM agora.jobs WHERE ({CLAIMABLE_NOW}) AND (queue, kind) > (p.queue, p.kind)
        ORDER BY queue, kind LIMIT 1
    ) AS next
)
SELECT p.queue, p.kind, waiting.jobs, waiting.since
FROM pairs AS p CROSS JOIN LATERAL (
    SELECT count(*)::int AS jobs, min(run_at) AS since FROM agora.jobs
    WHERE ({CLAIMABLE_NOW}) AND queue = p.queue AND kind = p.kind
) AS waiting
WHERE NOT EXISTS (SELECT FROM agora.workers AS w
                  WHERE {_live_worker("w", "$1")} AND p.queue = ANY(w.queues) AND (w.kinds IS NULL OR p.kind = ANY(w.kinds)))
ORDER BY waiting.jobs DESC, p.queue, p.kind
"""

# A kind's options as agora.workers.kind_options holds them (and as conflicts compare them).
_KIND_OPTIONS_JSON = ("jsonb_build_object('queue', {a}.queue, 'max_retries', {a}.max_retries, "
                      "'timeout_seconds', {a}.timeout_seconds, 'retry_backoff_seconds', {a}.retry_backoff_seconds)")

# Worker $1 declares the options of its kinds ($2 kinds; $3 queue, $4 max_retries, $5
# timeout_seconds, $6 retry_backoff_seconds, NULL: none): its agora.workers row keeps what
# it declared, and agora.kinds takes them (the latest declaration wins). Returns the kinds
# whose row was another live worker's ($7: seconds a worker counts as alive) with other
# options: what that worker declared, and what this one does (the statement reads the rows
# as they were before it).
DECLARE_KINDS = f"""
WITH declared AS (
    SELECT * FROM unnest($2::text[], $3::text[], $4::int[], $5::float8[], $6::float8[])
        AS d(kind, queue, max_retries, timeout_seconds, retry_backoff_seconds)
), recorded AS (
    UPDATE agora.workers
    SET kind_options = (SELECT jsonb_object_agg(d.kind, {_KIND_OPTIONS_JSON.format(a="d")}) FROM declared AS d)
    WHERE id = $1
), upserted AS (
    INSERT INTO agora.kinds AS k (kind, queue, max_retries, timeout_seconds, retry_backoff_seconds, declared_by)
    SELECT d.kind, d.queue, d.max_retries, d.timeout_seconds, d.retry_backoff_seconds, $1::text FROM declared AS d
    ON CONFLICT (kind) DO UPDATE SET queue = EXCLUDED.queue, max_retries = EXCLUDED.max_retries,
        timeout_seconds = EXCLUDED.timeout_seconds, retry_backoff_seconds = EXCLUDED.retry_backoff_seconds,
        declared_by = EXCLUDED.declared_by, declared_at = now()
)
SELECT k.kind, k.declared_by AS worker_id, {_KIND_OPTIONS_JSON.format(a="d")}::text AS declares,
       {_KIND_OPTIONS_JSON.format(a="k")}::text AS holds, $1::text AS declared_by
FROM agora.kinds AS k JOIN declared AS d ON d.kind = k.kind JOIN agora.workers AS w ON w.id = k.declared_by
WHERE w.id <> $1 AND {_live_worker("w", "$7")}
  AND {_KIND_OPTIONS_JSON.format(a="k")} <> {_KIND_OPTIONS_JSON.format(a="d")}
ORDER BY k.kind
"""

# Live workers ($1: seconds a worker counts as alive) that declared other options for a
# kind than the ones agora.kinds holds (another worker's, declared later), by kind.
KIND_CONFLICTS = f"""
SELECT k.kind, w.id AS worker_id, (w.kind_options -> k.kind)::text AS declares,
       {_KIND_OPTIONS_JSON.format(a="k")}::text AS holds, k.declared_by
FROM agora.kinds AS k JOIN agora.workers AS w ON w.kind_options ? k.kind
WHERE {_live_worker("w", "$1")} AND w.kind_options -> k.kind <> {_KIND_OPTIONS_JSON.format(a="k")}
ORDER BY k.kind, w.id
"""

# An attempt whose outcome its own worker has written (a rescue's row says
# WorkerLost): a renewal sent between that write and the worker letting go of the lease
# does not find the attempt held, but it is over, not lost to another worker.
_ENDED_BY_WORKER = "r.worker_id = $1 AND r.status <> 'running' AND r.error_type IS DISTINCT FROM 'WorkerLost'"

# The lease supervisor's renewal: worker $1 is alive, its worker lease (which covers
# the jobs it runs) is extended by $2 seconds. Its job rows are only read, through jobs_locked_by_idx:
# of the job attempts it holds ($3 ids, $4 attempts) it learns which it lost (rescued or
# taken over: no longer processing under its name) and whose cancel was asked for; of the
# jobs held in its name it learns which it does not know of (unknown: a claim that
# committed but whose reply was lost, started over a second ago). Held jobs that still
# have a lease of their own (claimed before the worker lease was live) are folded into
# the worker lease. A worker whose row is gone (deleted by hand) has no worker lease: its
# held jobs get, and keep renewed, leases of their own, as before worker leases.
# Rows locked right now are being finished by this worker: skipped rather than waited for
# (no deadlock with that statement), and not lost (the snapshot still shows
# them held). One round of 100 workers x 500 running jobs: 5-6x less server CPU and over
# 1,000x less WAL than an update of every job row (benchmarks/heartbeat_cost.py).
RENEW_LEASES = """
WITH worker AS (
    UPDATE agora.workers SET last_heartbeat_at = now(), lease_expires_at = now() + make_interval(secs => $2)
    WHERE id = $1
    RETURNING id
), wanted AS (
    SELECT * FROM unnest($3::bigint[], $4::int[]) AS t(id, attempt)
), mine AS MATERIALIZED (
    SELECT id, attempt, started_at, cancel_requested_at, lease_expires_at FROM agora.jobs
    WHERE locked_by = $1 AND status = 'processing'
), own_leases AS (
    SELECT j.id FROM agora.jobs AS j
    JOIN mine ON mine.id = j.id
    JOIN wanted ON wanted.id = mine.id AND wanted.attempt = mine.attempt
    WHERE (mine.lease_expires_at IS NOT NULL OR NOT EXISTS (SELECT 1 FROM worker))
      AND j.locked_by = $1 AND j.status = 'processing' AND j.attempt = wanted.attempt
    FOR UPDATE OF j SKIP LOCKED
), folded AS (
    UPDATE agora.jobs AS j
    SET lease_expires_at = CASE WHEN EXISTS (SELECT 1 FROM worker) THEN NULL
                                ELSE now() + make_interval(secs => $2) END
    FROM own_leases WHERE j.id = own_leases.id
)
SELECT lost.ids AS lost_job_ids, lost.attempts AS lost_job_attempts,
       cancel.ids AS cancel_job_ids, cancel.attempts AS cancel_job_attempts,
       ARRAY(SELECT m.id FROM mine AS m
             WHERE m.started_at < now() - interval '1 second'
               AND NOT EXISTS (SELECT 1 FROM wanted AS w WHERE w.id = m.id)
             ORDER BY m.id) AS unknown_job_ids,
       EXISTS (SELECT 1 FROM worker) AS worker_renewed
FROM (
    SELECT coalesce(array_agg(w.id ORDER BY w.id, w.attempt), '{}') AS ids,
           coalesce(array_agg(w.attempt ORDER BY w.id, w.attempt), '{}') AS attempts
    FROM wanted AS w WHERE NOT EXISTS (SELECT 1 FROM mine AS m WHERE m.id = w.id AND m.attempt = w.attempt)
      AND NOT EXISTS (SELECT 1 FROM agora.runs AS r WHERE r.job_id = w.id AND r.attempt = w.attempt
                      AND {_ENDED_BY_WORKER})
) AS lost, (
    SELECT coalesce(array_agg(w.id ORDER BY w.id), '{}') AS ids,
           coalesce(array_agg(w.attempt ORDER BY w.id), '{}') AS attempts
    FROM wanted AS w JOIN mine AS m ON m.id = w.id AND m.attempt = w.attempt
    WHERE m.cancel_requested_at IS NOT NULL
) AS cancel
""".replace("{_ENDED_BY_WORKER}", _ENDED_BY_WORKER)

# The channel a cancel of a running job is announced on (payload: the job id).
CANCEL_CHANNEL = "agora_cancel"
# Of the jobs $1 (bigint[]), those whose cancel was asked for (a worker that missed the
# notifications while its LISTEN connection was down).
CANCEL_REQUESTED = "SELECT id FROM agora.jobs WHERE id = ANY($1::bigint[]) AND cancel_requested_at IS NOT NULL"
CANCEL_JOB = CANCEL_JOB.replace("{cancel_channel}", CANCEL_CHANNEL)

# Worker w (agora.workers AS w) holds a running job (through jobs_locked_by_idx).
_HOLDS_RUNNING_JOB = "EXISTS (SELECT 1 FROM agora.jobs AS j WHERE j.locked_by = w.id AND j.status = 'processing')"

# Record a clean stop; a worker that holds no running job gives up its worker lease
# (one that still does, a job stuck in a thread, keeps it to pass and be rescued).
STOP_WORKER = f"""
UPDATE agora.workers AS w
SET stopped_at = now(), last_heartbeat_at = now(),
    lease_expires_at = CASE WHEN {_HOLDS_RUNNING_JOB} THEN w.lease_expires_at END
WHERE w.id = $1
"""

# Let go of the worker leases that passed over $1 seconds ago and cover no job (their
# jobs were rescued), so that the rescue stops looking at them. ($1 is far longer than
# any claim statement takes: a claim that saw the lease live has committed long before.)
SETTLE_WORKER_LEASES = f"""
UPDATE agora.workers AS w SET lease_expires_at = NULL
WHERE w.lease_expires_at < now() - make_interval(secs => $1) AND NOT {_HOLDS_RUNNING_JOB}
"""

# Give a lease of their own ($1 seconds) to running jobs that no worker lease can cover:
# their worker's row is gone (deleted by hand). Should that worker still run, its renewal
# keeps these leases renewed; if not, they pass and the jobs are rescued. (A scan of the
# running jobs: the rescuer runs it rarely.)
LEASE_UNCOVERED_JOBS = """
UPDATE agora.jobs AS j SET lease_expires_at = now() + make_interval(secs => $1)
WHERE j.status = 'processing' AND j.lease_expires_at IS NULL
  AND NOT EXISTS (SELECT 1 FROM agora.workers AS w WHERE w.id = j.locked_by)
"""

# Forget workers that have not been heard of for $1 seconds and hold no running job.
DELETE_STALE_WORKERS = f"""
DELETE FROM agora.workers AS w
WHERE w.last_heartbeat_at < now() - make_interval(secs => $1) AND NOT {_HOLDS_RUNNING_JOB}
"""

# -- schema ------------------------------------------------------------------

# Whether the agora schema has ever been migrated.
VERSION_TABLE_EXISTS = "SELECT to_regclass('agora.alembic_version') IS NOT NULL"

# The applied migration revisions.
SELECT_SCHEMA_VERSIONS = "SELECT version_num FROM agora.alembic_version"

# -- schedules -------------------------------------------------------------------

# A schedule's columns, with its live run (a pipeline's job that is pending or running):
# the job's id, the worker running it and until when that worker's lease holds; and since
# when it is orphaned (no live process declared it for SCHEDULE_ORPHANED_AFTER_SECONDS).
SCHEDULE_COLUMNS = (
    "pipeline_id, schedule_kind, schedule_spec, state, next_run_at, consecutive_errors, last_error, "
    "last_status, last_started_at, last_finished_at, error_backoff_seconds, max_consecutive_errors, job_kind, "
    f"CASE WHEN declared_at < now() - interval '{SCHEDULE_ORPHANED_AFTER_SECONDS} seconds' THEN declared_at END "
    "AS orphaned_since, "
    f"(SELECT j.id {_live_job_of('pipeline_id')}) AS job_id, "
    f"(SELECT j.locked_by {_live_job_of('pipeline_id')}) AS lease_owner, "
    "(SELECT COALESCE(j.lease_expires_at, (SELECT w.lease_expires_at FROM agora.workers AS w "
    f"WHERE w.id = j.locked_by)) {_live_job_of('pipeline_id')}) AS lease_expires_at"
)

# Register a pipeline's schedule; a changed spec recomputes next_run_at (and re-arms a completed
# one). A first run time $4 of NULL means now, by the database clock. $7: a new launch of a
# once-per-launch schedule, due now (a completed one active again) unless stopped or paused.
# $8: the kind a periodic job enqueues (NULL for a pipeline).
UPSERT_SCHEDULE = f"""
INSERT INTO agora.schedules AS s
    (pipeline_id, schedule_kind, schedule_spec, next_run_at, error_backoff_seconds, max_consecutive_errors,
     job_kind)
VALUES ($1, $2, $3, COALESCE($4, clock_timestamp()), $5, $6, $8)
ON CONFLICT (pipeline_id) DO UPDATE SET
    job_kind = EXCLUDED.job_kind,
    schedule_kind = EXCLUDED.schedule_kind,
    schedule_spec = EXCLUDED.schedule_spec,
    next_run_at = CASE WHEN s.schedule_spec <> EXCLUDED.schedule_spec THEN EXCLUDED.next_run_at
                       WHEN $7 AND s.state IN ('active', 'completed') THEN clock_timestamp()
                       ELSE s.next_run_at END,
    state = CASE WHEN s.state = 'completed' AND (s.schedule_spec <> EXCLUDED.schedule_spec OR $7) THEN 'active'
                 ELSE s.state END,
    error_backoff_seconds = EXCLUDED.error_backoff_seconds,
    max_consecutive_errors = EXCLUDED.max_consecutive_errors,
    updated_at = now(), declared_at = now()
RETURNING {SCHEDULE_COLUMNS}
"""

# A once-per-launch schedule $1 (spec $2) that another launch completed: due again now.
LAUNCH_ONCE_AGAIN = f"""
UPDATE agora.schedules SET state = 'active', next_run_at = clock_timestamp(), updated_at = now()
WHERE pipeline_id = $1 AND schedule_spec = $2 AND state = 'completed'
RETURNING {SCHEDULE_COLUMNS}
"""

# One schedule, with how many seconds (by the database clock) until it is due.
SELECT_SCHEDULE = f"""
SELECT {SCHEDULE_COLUMNS}, extract(epoch FROM next_run_at - clock_timestamp()) AS due_in_seconds
FROM agora.schedules WHERE pipeline_id = $1
"""

# The same for the schedules $1 (text[]) that the process reading them declares: their
# declared_at is brought up to date (at most every SCHEDULE_DECLARED_EVERY_SECONDS).
SELECT_DECLARED_SCHEDULES = f"""
WITH declared AS (
    UPDATE agora.schedules SET declared_at = now()
    WHERE pipeline_id = ANY($1::text[])
      AND declared_at < now() - interval '{SCHEDULE_DECLARED_EVERY_SECONDS} seconds'
)
{SELECT_SCHEDULE.replace("WHERE pipeline_id = $1", "WHERE pipeline_id = ANY($1::text[])")}"""

# Delete schedule $1 and its future ticks: a pipeline's run that has not started, and the
# jobs its periodic ticks enqueued ahead (due later, not started) are cancelled; a run under
# way finishes (its end finds no schedule to update). Its runs stay. Returns the schedule
# as it was, and how many jobs were cancelled.
DELETE_SCHEDULE = f"""
WITH schedule AS (
    SELECT {SCHEDULE_COLUMNS} FROM agora.schedules WHERE pipeline_id = $1 FOR UPDATE
), removed AS (
    DELETE FROM agora.schedules WHERE pipeline_id = (SELECT pipeline_id FROM schedule)
), ahead AS (
    SELECT j.id FROM agora.jobs AS j
    WHERE j.schedule_id = (SELECT pipeline_id FROM schedule) AND j.status = 'pending'
      AND (j.run_plan IS NOT NULL OR j.scheduled_for > now())
), cancelled AS (
    UPDATE agora.jobs AS j SET status = 'cancelled', finished_at = now(), delayed = false
    FROM ahead WHERE j.id = ahead.id AND ({CLAIMABLE})
    RETURNING j.id
)
SELECT schedule.*, (SELECT count(*) FROM cancelled)::int AS cancelled_jobs,
       pg_notify('{SCHEDULES_CHANNEL}', schedule.pipeline_id) AS woken
FROM schedule
"""

# The orphaned schedules other than $1 (text[]: those the caller declares), deleted with
# DELETE_SCHEDULE one by one (a WorkerPool's retire_undeclared_schedules).
ORPHANED_SCHEDULES = f"""
SELECT pipeline_id FROM agora.schedules
WHERE declared_at < now() - interval '{SCHEDULE_ORPHANED_AFTER_SECONDS} seconds' AND NOT pipeline_id = ANY($1::text[])
ORDER BY pipeline_id
"""

# No job of schedule s is alive: a pipeline's next run is due only once its last one ended.
_NO_LIVE_RUN = f"NOT EXISTS (SELECT {_live_job_of('s.pipeline_id')})"


def _launch_done(pipeline_id: str, launch: str) -> str:
    """A done run of once-per-launch pipeline ``pipeline_id`` by ``launch`` (SQL expressions)."""
    return (f"SELECT FROM agora.jobs AS j WHERE j.schedule_id = {pipeline_id} AND j.status = 'done' "
            f"AND j.run_plan->>'launch' = {launch}")


# The schedules $1 (text[]) this process serves, each registered with the spec at the
# same place in $2, and, for a once-per-launch pipeline, the launch at that place in $4
# ('' for others): a launch a run of which succeeded (whichever process ran it) wants no
# other run, while another launch of the same pipeline may still want one.
_WANTED = f"""
JOIN unnest($1::text[], $2::text[], $4::text[]) AS wanted(pipeline_id, spec, launch)
  ON s.pipeline_id = wanted.pipeline_id AND s.schedule_spec = wanted.spec
WHERE s.state = 'active'
  AND (wanted.launch = '' OR NOT EXISTS ({_launch_done("s.pipeline_id", "wanted.launch")}))"""

# The due ticks of the schedules wanted (_WANTED), or those due within $3 seconds
# (enqueued ahead, as jobs due at their tick), locked until the transaction that turns
# them into jobs ends (another process's scheduler skips them), with the database clock
# (one reading for all: the next cron tick after it is worked out once). A pipeline whose
# run is still alive is not due (its run's end sets its next run).
DUE_TICKS = f"""
SELECT s.pipeline_id, s.next_run_at AS tick, statement_timestamp() AS database_now
FROM agora.schedules AS s {_WANTED}
  AND s.next_run_at <= clock_timestamp() + make_interval(secs => $3) AND {_NO_LIVE_RUN}
ORDER BY s.pipeline_id
FOR UPDATE OF s SKIP LOCKED
"""

# A done run of once-per-launch pipeline $1 by launch $2, if any.
LAUNCH_SUCCEEDED = f"SELECT EXISTS ({_launch_done('$1', '$2')})"

# Ticks turned into jobs: job $1[i] runs schedule $2[i]'s tick $3[i], with the run plan
# $4[i] (JSON text; NULL: a periodic job's, whose schedule moves on now to its next run
# $5[i], NULL: never again, completed). The job's attempts are the tick's runs, recorded
# as they end. A pipeline's run enters the claim index now rather than by a promotion at
# its tick (a claim still takes none before its run_at, and the scheduler of each process
# that serves it wakes its pipeline worker at the tick). A tick is turned into a job once: DUE_TICKS
# locks its schedule row until this transaction, which also moves the schedule past it,
# commits.
RECORD_TICKS = """
WITH ticked AS (
    SELECT * FROM unnest($1::bigint[], $2::text[], $3::timestamptz[], $4::text[], $5::timestamptz[])
        AS t(job_id, schedule_id, tick, run_plan, next_run_at)
), marked AS (
    UPDATE agora.jobs AS j
    SET schedule_id = t.schedule_id, scheduled_for = t.tick, run_plan = t.run_plan::jsonb,
        delayed = j.delayed AND t.run_plan IS NULL
    FROM ticked AS t WHERE j.id = t.job_id
)
UPDATE agora.schedules AS s
SET next_run_at = COALESCE(t.next_run_at, s.next_run_at),
    state = CASE WHEN t.next_run_at IS NULL THEN 'completed' ELSE s.state END, updated_at = now()
FROM ticked AS t WHERE s.pipeline_id = t.schedule_id AND t.run_plan IS NULL
"""

# Seconds (by the database clock) until the first of schedules $1 (registered with the specs
# $2) falls due; NULL when none is active and idle. Negative: one is due now (another
# process holds it).
NEXT_TICK_IN = f"""
SELECT extract(epoch FROM min(s.next_run_at) FILTER (WHERE {_NO_LIVE_RUN}) - clock_timestamp()) AS seconds,
       extract(epoch FROM min(s.next_run_at) FILTER (WHERE s.job_kind IS NULL AND s.next_run_at > clock_timestamp())
               - clock_timestamp()) AS run_in
FROM agora.schedules AS s {_WANTED.replace("$4", "$3")}
"""

# The database clock.
DATABASE_NOW = "SELECT clock_timestamp()"

# Database liveness for the health server.
PING = "SELECT 1"

# -- listing and changing jobs, schedules and runs (the API and the operator CLI) ----

RUN_COLUMNS = (
    "id, job_id, pipeline_id, attempt, worker_id, started_at, finished_at, status, error_type, "
    "error_message, scheduled_for, traceback, progress::text AS progress, result::text AS result"
)

# Filters a job listing may combine: each compares one column with one parameter.
JOB_FILTERS = {
    "status": "status = {0}", "kind": "kind = {0}", "queue": "queue = {0}", "before_id": "id < {0}",
    # the id, or text in the kind, the name or the payload (any case); it reads rows newest
    # first until a page is found: for the dashboard, not for a hot path
    "search": "(id::text = {0} OR strpos(lower(kind || ' ' || name || ' ' || payload::text), lower({0})) > 0)",
}

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
        f"SELECT {JOB_READ_COLUMNS} FROM agora.jobs {_where(JOB_FILTERS, filters)} "
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

# The run status of each attempt ($1 job ids, $2 attempts) that has a run row.
RUN_STATUSES_OF_ATTEMPTS = """
SELECT r.job_id, r.attempt, r.status FROM agora.runs AS r
JOIN unnest($1::bigint[], $2::int[]) AS a(job_id, attempt) ON r.job_id = a.job_id AND r.attempt = a.attempt
"""

# Give a failed or cancelled job another attempt now, waking the workers of its queue.
# retry_count keeps counting, so it retries on its own again only while retry_count < max_retries.
RETRY_JOB = f"""
WITH retried AS (
    UPDATE agora.jobs
    SET status = 'pending', run_at = now(), finished_at = NULL, locked_by = NULL, lease_expires_at = NULL,
        cancel_requested_at = NULL, delayed = false
    WHERE id = $1 AND status IN ('failed', 'cancelled')
    RETURNING {JOB_COLUMNS}
)
SELECT retried.* FROM retried, LATERAL (SELECT pg_notify('agora_jobs', retried.queue)) AS woken
"""

# Every schedule, by pipeline id.
LIST_SCHEDULES = f"SELECT {SCHEDULE_COLUMNS} FROM agora.schedules ORDER BY pipeline_id"

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
UPDATE agora.schedules AS s SET next_run_at = now(), updated_at = now()
WHERE s.pipeline_id = $1 AND s.state = 'active' AND {_NO_LIVE_RUN}
RETURNING {SCHEDULE_COLUMNS}, {_WAKE_SCHEDULE}
"""

# -- metrics (each reads an index, not the whole history) --------------------------

# Live jobs (pending, processing, failed and waiting for a retry) by queue and status.
# Jobs with work ahead of them by queue and state (pending, processing, retrying), and
# per queue the age of the oldest due one: the agora.queue_now view, which the README's
# "queue right now" query reads too, so that both count the same jobs.
METRIC_QUEUE_NOW = "SELECT queue, state, jobs, oldest_due_seconds FROM agora.queue_now"

# Schedules by state, how many active ones are backing off after errors, and how many
# no live process declares (orphaned).
METRIC_SCHEDULES = f"""
SELECT state, count(*) AS schedules,
       count(*) FILTER (WHERE state = 'active' AND consecutive_errors > 0) AS in_backoff,
       count(*) FILTER (WHERE declared_at < now() - interval '{SCHEDULE_ORPHANED_AFTER_SECONDS} seconds') AS orphaned
FROM agora.schedules GROUP BY state
"""

# Each limited queue (agora.queue_limits): its limits, its starts in the rate window, its
# running and its waiting jobs (for /metrics and the dashboard).
QUEUE_LIMITS_NOW = """
SELECT l.queue, l.concurrency, l.rate, l.rate_seconds, l.declared_in,
       (SELECT count(*) FROM agora.queue_starts AS s
        WHERE s.queue = l.queue AND s.started_at > now() - make_interval(secs => l.rate_seconds))::int AS started,
       COALESCE((SELECT sum(jobs) FROM agora.queue_now AS q WHERE q.queue = l.queue AND q.state = 'processing'), 0)
           ::int AS running,
       COALESCE((SELECT sum(jobs) FROM agora.queue_now AS q WHERE q.queue = l.queue AND q.state <> 'processing'), 0)
           ::int AS waiting
FROM agora.queue_limits AS l ORDER BY l.queue
"""

# Each limited kind (agora.kind_limits): its limits, its running jobs, how many of its keys
# are at a limit (no room to start one more: agora.limit_room), and how many of its jobs
# are due and waiting (for /metrics and the dashboard).
KIND_LIMITS_NOW = f"""
SELECT l.kind, l.concurrency, l.limit_by, l.rate, l.rate_seconds, l.fair_by,
       (SELECT count(*) FROM agora.jobs AS j WHERE j.status = 'processing' AND j.kind = l.kind)::int AS running,
       (SELECT count(*) FROM agora.limit_room(ARRAY[l.kind]) AS r WHERE r.room <= 0)::int AS full_keys,
       w.waiting, w.waiting_keys, l.declared_in
FROM agora.kind_limits AS l
CROSS JOIN LATERAL (
    SELECT count(*)::int AS waiting, count(DISTINCT j.fair_key)::int AS waiting_keys FROM agora.jobs AS j
    WHERE j.kind = l.kind AND ({CLAIMABLE_NOW}) AND j.run_at <= now()
) AS w
ORDER BY l.kind
"""

# -- pipelines: checkpoints and dead letters ------------------------------------------

# Where pipeline $1's source resumes, and which source saved it.
SELECT_CHECKPOINT = "SELECT position::text AS position, source FROM agora.checkpoints WHERE pipeline_id = $1"

# Save pipeline $1's source position $2 (JSON) for source $3, by run $4.
SAVE_CHECKPOINT = """
INSERT INTO agora.checkpoints (pipeline_id, position, source, job_id, updated_at)
VALUES ($1, $2::text::jsonb, $3, $4, now())
ON CONFLICT (pipeline_id) DO UPDATE
SET position = EXCLUDED.position, source = EXCLUDED.source, run_id = NULL, job_id = EXCLUDED.job_id,
    updated_at = now()
"""

# Record rejected records of pipeline $1, run by job $2 (NULL: a run outside any job),
# from parallel arrays (stage, record JSON, error type, message).
INSERT_DEAD_LETTERS = """
INSERT INTO agora.dead_letters (pipeline_id, job_id, stage, record, error_type, error_message)
SELECT $1, $2, stage, record::jsonb, error_type, error_message
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS t(stage, record, error_type, error_message)
"""

DEAD_LETTER_COLUMNS = (
    "id, pipeline_id, run_id, job_id, stage, record::text AS record, error_type, error_message, created_at, "
    "replayed_at"
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


def quote_identifier(name: str) -> str:
    """``name`` as a PostgreSQL identifier (table and column names cannot be parameters)."""
    return '"' + name.replace('"', '""') + '"'


def insert_row(schema: str, table: str, columns: Sequence[str]) -> str:
    """Insert one row into a user's table, values as parameters $1, $2, ..."""
    names = ", ".join(quote_identifier(column) for column in columns)
    values = ", ".join(f"${i}" for i in range(1, len(columns) + 1))
    return f"INSERT INTO {quote_identifier(schema)}.{quote_identifier(table)} ({names}) VALUES ({values})"

# The columns of a user's table $1.$2, in order, with their types (for a DatabaseSink: which
# columns to write when none are given, and how to type text values for them).
TABLE_COLUMNS = """
SELECT column_name, udt_name FROM information_schema.columns
WHERE table_schema = $1 AND table_name = $2 AND is_generated = 'NEVER'
ORDER BY ordinal_position
"""

# Which server and database a connection is on (two handles on the same database answer alike).
DATABASE_IDENTITY = "SELECT current_database(), pg_postmaster_start_time()::text, current_setting('port')"


# -- pruning finished history (agora_pg.retention) ----------------------------------

# One process at a time prunes: each batch runs in a transaction that first takes this
# transaction-level advisory lock without waiting ($1 = PRUNE_LOCK_KEY).
PRUNE_LOCK_KEY = 0x61676F7261_7072  # "agora", "pr"
TRY_PRUNE_LOCK = "SELECT pg_try_advisory_xact_lock($1)"

# Up to $3 finished jobs: done or cancelled before now() - $1, or failed for good before
# now() - $2 (their runs go with them, by the trigger jobs_delete_runs). Walks the primary
# key from the oldest job, so a batch reads few rows beyond the ones it deletes. The
# outer WHERE repeats the condition: a job retried between the subquery and the delete
# is checked again as it is now (and kept).
_PRUNABLE_JOB = """(
    (status IN ('done', 'cancelled') AND finished_at < now() - $1::interval)
    OR (status = 'failed' AND NOT coalesce(retry_count < max_retries, false) AND finished_at < now() - $2::interval)
)"""
PRUNE_JOBS = f"""
DELETE FROM agora.jobs
WHERE id IN (SELECT id FROM agora.jobs WHERE {_PRUNABLE_JOB} ORDER BY id LIMIT $3)
  AND {_PRUNABLE_JOB}
"""

# Up to $2 pipeline runs that ended before now() - $1.
PRUNE_PIPELINE_RUNS = """
DELETE FROM agora.runs WHERE id IN (
    SELECT id FROM agora.runs
    WHERE job_id IS NULL AND finished_at < now() - $1::interval
    ORDER BY finished_at LIMIT $2
)
"""

# Up to $2 dead letters replayed before now() - $1.
PRUNE_DEAD_LETTERS = """
DELETE FROM agora.dead_letters WHERE id IN (
    SELECT id FROM agora.dead_letters WHERE replayed_at < now() - $1::interval ORDER BY id LIMIT $2
)
"""

# -- progress and the event stream (agora_pg.events) ----------------------------------

EVENTS_CHANNEL = "agora_events"  # payload '' (tables changed: read them) or a progress event (JSON)

# Worker $1 stores the latest progress of attempts (id, attempt, report JSON) it still
# holds, and publishes each (a report too big for a notification goes without its message).
REPORT_JOB_PROGRESS = f"""
WITH reported AS (
    UPDATE agora.jobs AS j SET progress = t.progress::jsonb
    FROM unnest($2::bigint[], $3::int[], $4::text[]) AS t(id, attempt, progress)
    WHERE j.id = t.id AND j.attempt = t.attempt AND j.locked_by = $1
    RETURNING j.id, j.attempt, j.kind, j.queue, j.progress
), published AS (
    SELECT json_build_object('type', 'job.progress', 'job_id', id, 'attempt', attempt, 'kind', kind,
                             'queue', queue, 'progress', progress)::text AS event,
           json_build_object('type', 'job.progress', 'job_id', id, 'attempt', attempt, 'kind', kind,
                             'queue', queue, 'progress', progress - 'message')::text AS short_event
    FROM reported
)
SELECT pg_notify('{EVENTS_CHANNEL}', CASE WHEN octet_length(event) < 7900 THEN event ELSE short_event END)
FROM published
"""

# The time before which every change is committed (and so visible): the start of the
# oldest open transaction of another client of this database (one that has not written
# yet may still write rows stamped with its start), but no further back than $1 seconds.
# Rows are stamped with their transaction's now(), so a row stamped earlier than this
# cannot still appear.
EVENTS_SAFE_TIME = """
SELECT now() AS now, greatest(
    least(now(), (SELECT min(xact_start) FROM pg_stat_activity
                  WHERE datname = current_database() AND pid <> pg_backend_pid()
                    AND backend_type = 'client backend' AND state <> 'idle')),
    now() - make_interval(secs => $1)) AS safe
"""

# Every event source reads rows stamped at or after $1, after the key ($6 time, $7 id)
# of the page before, at most $8, matching the filters $2 job id, $3 kind, $4 queue and
# $5 pipeline id (NULL: any), in (time, id) order, with the columns t, key_id, job_id,
# run_id, pipeline_id, kind, queue, job_status, attempt, outcome, error, retry_at,
# worker_id, scheduled_for, progress.
_JOB_FILTERS = ("($2::bigint IS NULL OR j.id = $2) AND ($3::text IS NULL OR j.kind = $3) "
                "AND ($4::text IS NULL OR j.queue = $4) "
                "AND ($5::text IS NULL OR j.schedule_id = $5)")


def _event_source(select: str, time: str, key: str, source: str, where: str) -> str:
    return f"""
SELECT {time} AS t, {key} AS key_id, {select}
FROM {source}
WHERE {time} >= $1 AND ({time}, {key}) > ($6::timestamptz, $7::bigint) AND {where}
ORDER BY {time}, {key}
LIMIT $8
"""


# job.enqueued: jobs inserted (the BRIN index on created_at finds the recent ones).
EVENTS_ENQUEUED = _event_source(
    "j.id AS job_id, NULL::bigint AS run_id, j.schedule_id AS pipeline_id, j.kind, j.queue, j.status AS job_status, "
    "j.attempt, NULL::text AS outcome, NULL::text AS error, j.run_at AS retry_at, NULL::text AS worker_id, "
    "j.scheduled_for, NULL::text AS progress",
    "j.created_at", "j.id", "agora.jobs AS j", _JOB_FILTERS,
)

# job.started: attempts that began at or after $1, running now (jobs_locked_by_idx holds
# them) or ended since (their runs: a job that ends within a read still shows its start).
EVENTS_STARTED = _event_source(
    "j.id AS job_id, NULL::bigint AS run_id, j.schedule_id AS pipeline_id, j.kind, j.queue, j.status AS job_status, "
    "j.attempt, NULL::text AS outcome, NULL::text AS error, NULL::timestamptz AS retry_at, j.locked_by AS worker_id, "
    "j.scheduled_for, j.progress::text AS progress", "j.started_at", "j.id",
    "(SELECT id, schedule_id, kind, queue, status, attempt, locked_by, scheduled_for, progress, started_at "
    " FROM agora.jobs WHERE status = 'processing' UNION ALL SELECT r.job_id, j.schedule_id, j.kind, j.queue, j.status, "
    " r.attempt, r.worker_id, r.scheduled_for, r.progress, r.started_at FROM agora.runs AS r "
    " JOIN agora.jobs AS j ON j.id = r.job_id WHERE r.finished_at >= $1) AS j", _JOB_FILTERS,
)

# job.finished: every attempt that ended (a pipeline's run too), with its job as it is
# now (retry_at: the job will run again then, from this attempt's failure).
EVENTS_FINISHED = _event_source(
    "r.job_id, r.id AS run_id, r.pipeline_id, j.kind, j.queue, j.status AS job_status, r.attempt, "
    "r.status AS outcome, r.error_message AS error, "
    "CASE WHEN j.attempt = r.attempt AND (j.status = 'pending' OR (j.status = 'failed' "
    "AND j.retry_count < j.max_retries)) THEN j.run_at END AS retry_at, r.worker_id, r.scheduled_for, "
    "r.progress::text AS progress",
    "r.finished_at", "r.id", "agora.runs AS r JOIN agora.jobs AS j ON j.id = r.job_id",
    "($2::bigint IS NULL OR r.job_id = $2) AND ($3::text IS NULL OR j.kind = $3) "
    "AND ($4::text IS NULL OR j.queue = $4) AND ($5::text IS NULL OR r.pipeline_id = $5)",
)

# job.cancelled: jobs cancelled while not running (a running one's cancel ends its attempt).
EVENTS_CANCELLED = _event_source(
    "j.id AS job_id, NULL::bigint AS run_id, j.schedule_id AS pipeline_id, j.kind, j.queue, j.status AS job_status, "
    "j.attempt, 'cancelled' AS outcome, j.error_message AS error, NULL::timestamptz AS retry_at, "
    "NULL::text AS worker_id, j.scheduled_for, NULL::text AS progress",
    "j.finished_at", "j.id", "agora.jobs AS j",
    f"j.status = 'cancelled' AND {_JOB_FILTERS} AND NOT EXISTS "
    "(SELECT 1 FROM agora.runs AS r WHERE r.job_id = j.id AND r.finished_at = j.finished_at)",
)

EVENT_SOURCES = {  # read in this order, each statement a later snapshot: a change seen comes with those before it
    "finished": EVENTS_FINISHED,  # job.finished (its job's start and enqueue are read after it, so seen too)
    "job.cancelled": EVENTS_CANCELLED,
    "job.started": EVENTS_STARTED,
    "job.enqueued": EVENTS_ENQUEUED,
}

# -- the dashboard (agora_pg.api.dashboard): read-only -----------------------------------

# Attempts and pipeline runs finished per minute over the last hour, by outcome.
DASHBOARD_THROUGHPUT = """
SELECT extract(epoch FROM date_trunc('minute', finished_at))::bigint AS minute,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status <> 'succeeded') AS failed
FROM agora.runs
WHERE finished_at > now() - interval '1 hour'
GROUP BY 1 ORDER BY 1
"""

# Workers that renewed their heartbeat in the last $1 seconds, with the jobs they run now.
DASHBOARD_WORKERS = """
SELECT w.id, w.hostname, w.pid, w.queues, w.started_at, w.last_heartbeat_at,
       extract(epoch FROM now() - w.last_heartbeat_at) AS heartbeat_age,
       (SELECT count(*) FROM agora.jobs AS j WHERE j.status = 'processing' AND j.locked_by = w.id) AS running
FROM agora.workers AS w
WHERE w.stopped_at IS NULL AND w.last_heartbeat_at > now() - make_interval(secs => $1)
ORDER BY w.started_at
"""

# The queue right now (agora.queue_now).
DASHBOARD_QUEUES = "SELECT queue, state, jobs, due, oldest_due_seconds FROM agora.queue_now ORDER BY queue, state"

# Every schedule with its health (agora.schedule_health).
DASHBOARD_SCHEDULES = "SELECT * FROM agora.schedule_health ORDER BY in_trouble DESC, pipeline_id"

# The last $1 runs of each pipeline begun in the last day, newest first.
DASHBOARD_PIPELINE_RUNS = """
SELECT id, pipeline_id, status, started_at, finished_at, error_message, progress::text AS progress,
       extract(epoch FROM coalesce(finished_at, now()) - started_at) AS seconds
FROM (
    SELECT *, row_number() OVER (PARTITION BY pipeline_id ORDER BY started_at DESC) AS newest
    FROM agora.runs WHERE pipeline_id IS NOT NULL AND started_at > now() - interval '1 day'
) AS recent
WHERE newest <= $1
ORDER BY pipeline_id, started_at DESC
"""

# The newest $1 dead letters waiting for a replay.
DASHBOARD_DEAD_LETTERS = """
SELECT id, pipeline_id, job_id, stage, record::text AS record, error_type, error_message, created_at
FROM agora.dead_letters WHERE replayed_at IS NULL ORDER BY id DESC LIMIT $1
"""

