"""Flow control as one claim: queue limits join kind limits, key limits, rates and fair
share in ``agora.claim_limited_jobs``, one statement that never waits on a lock.

Until now a limited queue was claimed by a transaction of its own (5-7 round trips)
that locked the queue's ``agora.queue_limits`` row with ``FOR UPDATE`` and waited for
it: one worker frozen inside that transaction stopped the queue's claims everywhere.
The function now takes the kinds a worker handles and all its queues, and claims the
jobs of its limited kinds (in any queue) and every job of its limited queues:

1. It reads the due jobs: the first ``depth`` of each (queue, kind) pair that has a
   limit (a limited kind's pair reads ``scan`` rows, a limited queue's other pairs
   ``wanted``; jobs with a key of fair share are read per key instead, as before).
   It counts each key's room, keeps the jobs that fit it (and each queue's limit), and
   takes a transaction-scoped advisory lock on each key and each queue it would take
   from, skipping those another claim holds (``pg_try_advisory_xact_lock``).
2. At ``taken_at``, the database's clock read after those locks are held and after the
   snapshot of the statement that counts, it counts the room again (running jobs, and starts in
   the window ending at ``taken_at``), claims what still fits, and stamps the jobs'
   ``started_at`` and their starts (``agora.kind_starts``, ``agora.queue_starts``)
   with ``taken_at``: the instant the counts used, so that a window of ``started_at``
   never holds more than the rate.

``agora.limit_room(kinds, at)`` and ``agora.queue_room(queues, at)`` count the room at
an instant. Starts older than their window are deleted by the claims.

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

NO_LIMIT = 2147483647  # the room of a limit not set
_CLAIMABLE = "(j.status = 'pending' OR (j.status = 'failed' AND j.retry_count < j.max_retries))"
_CLAIMABLE_NOW = f"{_CLAIMABLE} AND NOT j.delayed AND j.run_at <= now()"
_KEY = "COALESCE(agora.limit_key({payload}->>l.limit_by), '')"

# Each key of the limited kinds that has running jobs or starts in the window ending at
# ``at``: how many more of its jobs may start (the least of both limits' room; a key
# not listed has a whole limit's room).
LIMIT_ROOM = rf"""
CREATE FUNCTION agora.limit_room(kinds text[], at timestamptz DEFAULT now())
RETURNS TABLE (kind text, key text, room integer) LANGUAGE sql STABLE AS $$
    WITH running AS (
        SELECT j.kind, {_KEY.format(payload="j.payload")} AS key, count(*)::integer AS n
        FROM agora.jobs AS j JOIN agora.kind_limits AS l ON l.kind = j.kind
        WHERE j.status = 'processing' AND j.kind = ANY(kinds) AND l.concurrency IS NOT NULL
        GROUP BY 1, 2
    ), started AS (
        SELECT s.kind, s.key, count(*)::integer AS n
        FROM agora.kind_starts AS s JOIN agora.kind_limits AS l ON l.kind = s.kind
        WHERE s.kind = ANY(kinds) AND l.rate IS NOT NULL AND s.started_at > at - make_interval(secs => l.rate_seconds)
        GROUP BY 1, 2
    )
    SELECT k.kind, k.key,
           LEAST(COALESCE(l.concurrency - COALESCE(r.n, 0), {NO_LIMIT}), COALESCE(l.rate - COALESCE(s.n, 0), {NO_LIMIT}))
    FROM (SELECT running.kind, running.key FROM running UNION SELECT started.kind, started.key FROM started) AS k
    JOIN agora.kind_limits AS l ON l.kind = k.kind
    LEFT JOIN running AS r ON r.kind = k.kind AND r.key = k.key
    LEFT JOIN started AS s ON s.kind = k.kind AND s.key = k.key
$$
"""

# Each of the limited queues: how many more of its jobs may start at ``at``.
QUEUE_ROOM = rf"""
CREATE FUNCTION agora.queue_room(queues text[], at timestamptz DEFAULT now())
RETURNS TABLE (queue text, room integer) LANGUAGE sql STABLE AS $$
    SELECT l.queue, LEAST(
        CASE WHEN l.concurrency IS NULL THEN {NO_LIMIT}
             ELSE l.concurrency - (SELECT count(*) FROM agora.jobs AS j
                                   WHERE j.status = 'processing' AND j.queue = l.queue)::integer END,
        CASE WHEN l.rate IS NULL THEN {NO_LIMIT}
             ELSE l.rate - (SELECT count(*) FROM agora.queue_starts AS s
                            WHERE s.queue = l.queue AND s.started_at > at - make_interval(secs => l.rate_seconds))::integer
        END)
    FROM agora.queue_limits AS l WHERE l.queue = ANY(queues)
$$
"""

CLAIM_LIMITED_JOBS = rf"""
CREATE OR REPLACE FUNCTION agora.claim_limited_jobs(
    queues text[], kinds text[], scan integer, wanted integer, worker text, lease_seconds double precision,
    after_key text
) RETURNS SETOF agora.jobs LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    limited_kinds text[];  -- of kinds, those with flow control
    keyed_kinds text[];  -- of those, the ones shared by a key
    limited_queues text[];  -- of queues, those with limits
    ids bigint[];
    id_kinds text[];
    id_keys text[];
    id_queues text[];
    fair_queues text[] := '{{}}';
    fair_keys text[] := '{{}}';
    queue_name text;
    previous text;
    found_key text;
    wrapped boolean;
    key_budget integer := greatest(2 * wanted, 20);  -- keys visited at most (some may be full)
    per_key integer;
    taken_at timestamptz;
BEGIN
    SELECT COALESCE(array_agg(l.kind), '{{}}'),
           COALESCE(array_agg(l.kind) FILTER (WHERE COALESCE(l.fair_by, l.limit_by) IS NOT NULL), '{{}}')
    INTO limited_kinds, keyed_kinds FROM agora.kind_limits AS l WHERE l.kind = ANY(kinds);
    SELECT COALESCE(array_agg(l.queue), '{{}}') INTO limited_queues FROM agora.queue_limits AS l
    WHERE l.queue = ANY(queues);
    IF cardinality(limited_kinds) = 0 AND cardinality(limited_queues) = 0 THEN
        RETURN;
    END IF;

    -- The keys with due jobs of the keyed kinds, in key order from after_key, wrapping around.
    IF cardinality(keyed_kinds) > 0 THEN
        FOREACH queue_name IN ARRAY queues LOOP
            previous := after_key;
            wrapped := after_key IS NULL;
            WHILE cardinality(fair_keys) < key_budget LOOP
                IF previous IS NULL THEN
                    SELECT j.fair_key INTO found_key FROM agora.jobs AS j
                    WHERE {_CLAIMABLE_NOW} AND j.queue = queue_name AND j.fair_key IS NOT NULL
                      AND j.kind = ANY(keyed_kinds)
                    ORDER BY j.fair_key LIMIT 1;
                ELSE
                    SELECT j.fair_key INTO found_key FROM agora.jobs AS j
                    WHERE {_CLAIMABLE_NOW} AND j.queue = queue_name AND j.fair_key > previous
                      AND j.kind = ANY(keyed_kinds)
                    ORDER BY j.fair_key LIMIT 1;
                END IF;
                IF NOT FOUND THEN
                    EXIT WHEN wrapped;
                    wrapped := true;
                    previous := NULL;
                    CONTINUE;
                END IF;
                EXIT WHEN wrapped AND after_key IS NOT NULL AND found_key > after_key;  -- came round
                fair_queues := fair_queues || queue_name;
                fair_keys := fair_keys || found_key;
                previous := found_key;
            END LOOP;
        END LOOP;
    END IF;
    per_key := greatest(1, ceil(wanted::numeric / greatest(cardinality(fair_keys), 1))::integer);

    WITH pairs AS (  -- each (queue, kind) with a limit, and how deep its jobs are read
        SELECT q.name AS queue, k.name AS kind, k.name = ANY(keyed_kinds) AS keyed,
               CASE WHEN k.name = ANY(limited_kinds) THEN greatest(scan, wanted) ELSE wanted END AS depth
        FROM unnest(queues) AS q(name) CROSS JOIN unnest(kinds) AS k(name)
        WHERE k.name = ANY(limited_kinds) OR q.name = ANY(limited_queues)
    ), headed AS (  -- jobs without a key of fair share: each pair's first, in claim order
        SELECT best.id, best.kind, best.queue, best.payload, best.priority, best.run_at,
               row_number() OVER (ORDER BY best.priority DESC, best.run_at, best.id) AS turn
        FROM pairs AS p
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.queue, j.payload, j.priority, j.run_at, j.fair_key FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = p.queue AND j.kind = p.kind
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT p.depth
        ) AS best
        WHERE NOT p.keyed OR best.fair_key IS NULL
    ), keyed AS (  -- the first jobs of each key visited: turn n takes each key's n-th job
        SELECT best.id, best.kind, best.queue, best.payload, best.priority, best.run_at,
               (best.rank - 1) * cardinality(fair_keys) + v.position AS turn
        FROM unnest(fair_queues, fair_keys) WITH ORDINALITY AS v(queue, fair_key, position)
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.queue, j.payload, j.priority, j.run_at,
                   row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS rank
            FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = v.queue AND j.fair_key = v.fair_key AND j.kind = ANY(keyed_kinds)
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT per_key
        ) AS best
    ), due AS (
        SELECT d.id, d.kind, d.queue, d.priority, d.run_at, d.turn,
               CASE WHEN l.kind IS NULL THEN '' ELSE {_KEY.format(payload="d.payload")} END AS key,
               COALESCE(l.concurrency IS NOT NULL OR l.rate IS NOT NULL, false) AS counted,
               COALESCE(LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT})), {NO_LIMIT}) AS kind_limit_room,
               ql.queue IS NOT NULL AS queue_limited,
               LEAST(COALESCE(ql.concurrency, {NO_LIMIT}), COALESCE(ql.rate, {NO_LIMIT})) AS queue_limit_room
        FROM (SELECT * FROM headed UNION ALL SELECT * FROM keyed) AS d
        LEFT JOIN agora.kind_limits AS l ON l.kind = d.kind
        LEFT JOIN agora.queue_limits AS ql ON ql.queue = d.queue
    ), free AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT * FROM agora.limit_room(limited_kinds)
    ), kind_fitting AS (
        SELECT d.* FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.turn, d.priority DESC, d.run_at, d.id)
                   AS kind_rank
            FROM due AS d
        ) AS d
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE NOT d.counted OR d.kind_rank <= COALESCE(f.room, d.kind_limit_room)
    ), fitting AS (  -- (a queue's room is counted once, under its lock: below)
        SELECT d.id, d.kind, d.key, d.queue, d.counted, d.queue_limited FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.queue ORDER BY d.turn, d.priority DESC, d.run_at, d.id)
                   AS queue_rank
            FROM kind_fitting AS d
        ) AS d
        WHERE NOT d.queue_limited OR d.queue_rank <= d.queue_limit_room
        ORDER BY d.turn, d.priority DESC, d.run_at, d.id
        LIMIT wanted
    ), locked_keys AS (  -- (a kind without a limit, shared by key alone, needs no lock)
        SELECT keys.kind, keys.key FROM (SELECT DISTINCT fitting.kind, fitting.key FROM fitting WHERE fitting.counted) AS keys
        WHERE pg_try_advisory_xact_lock(6383468, hashtext(keys.kind || chr(31) || keys.key))
    ), locked_queues AS (
        SELECT queues.queue FROM (SELECT DISTINCT fitting.queue FROM fitting WHERE fitting.queue_limited) AS queues
        WHERE pg_try_advisory_xact_lock(6383469, hashtext(queues.queue))
    )
    SELECT array_agg(f.id), array_agg(f.kind), array_agg(f.key), array_agg(f.queue)
    INTO ids, id_kinds, id_keys, id_queues
    FROM fitting AS f
    WHERE (NOT f.counted OR EXISTS (SELECT FROM locked_keys AS k WHERE k.kind = f.kind AND k.key = f.key))
      AND (NOT f.queue_limited OR EXISTS (SELECT FROM locked_queues AS q WHERE q.queue = f.queue));
    IF ids IS NULL THEN
        RETURN;
    END IF;
    RETURN QUERY
    -- (taken_at: the clock read by this statement, after its snapshot, so that every outcome
    -- the snapshot sees ended before it and every start it counts began before it. The rows
    -- are read by id alone and their state tested after: with the state in the same WHERE,
    -- a planner without statistics scans the claim index for the ids.)
    WITH taken AS MATERIALIZED (
        SELECT clock_timestamp() AS taken_at
    ), due AS (
        SELECT d.id, d.kind, d.key, j.queue, j.status, j.retry_count, j.max_retries, j.delayed, j.priority, j.run_at
        FROM unnest(ids, id_kinds, id_keys) AS d(id, kind, key)
        CROSS JOIN LATERAL (SELECT * FROM agora.jobs AS j WHERE j.id = d.id OFFSET 0) AS j
    ), free AS MATERIALIZED (
        SELECT * FROM agora.limit_room(id_kinds, (SELECT t.taken_at FROM taken AS t))
    ), queue_free AS MATERIALIZED (
        SELECT * FROM agora.queue_room(id_queues, (SELECT t.taken_at FROM taken AS t))
    ), kind_fitting AS (
        SELECT d.* FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.priority DESC, d.run_at, d.id) AS kind_rank
            FROM due AS d
            WHERE (d.status = 'pending' OR (d.status = 'failed' AND d.retry_count < d.max_retries))
              AND NOT d.delayed AND d.run_at <= now()
        ) AS d
        LEFT JOIN agora.kind_limits AS l ON l.kind = d.kind
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE l.kind IS NULL OR (l.concurrency IS NULL AND l.rate IS NULL)
           OR d.kind_rank <= COALESCE(f.room, LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT})))
    ), fitting AS (
        SELECT d.id FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.queue ORDER BY d.priority DESC, d.run_at, d.id) AS queue_rank
            FROM kind_fitting AS d
        ) AS d
        LEFT JOIN agora.queue_limits AS ql ON ql.queue = d.queue
        LEFT JOIN queue_free AS f ON f.queue = d.queue
        WHERE ql.queue IS NULL
           OR d.queue_rank <= COALESCE(f.room, LEAST(COALESCE(ql.concurrency, {NO_LIMIT}), COALESCE(ql.rate, {NO_LIMIT})))
    ), chosen AS (
        SELECT j.id, j.status, j.retry_count, j.max_retries, j.delayed, j.run_at FROM agora.jobs AS j
        WHERE j.id = ANY(ARRAY(SELECT fitting.id FROM fitting))
        FOR UPDATE OF j SKIP LOCKED
    ), claimed AS (
        UPDATE agora.jobs AS j
        SET status = 'processing', started_at = (SELECT t.taken_at FROM taken AS t), finished_at = NULL, locked_by = worker,
            lease_expires_at = CASE WHEN (SELECT w.lease_expires_at FROM agora.workers AS w WHERE w.id = worker) > now()
                                    THEN NULL ELSE now() + make_interval(secs => lease_seconds) END,
            attempt = j.attempt + 1, cancel_requested_at = NULL, progress = NULL
        FROM chosen AS c
        WHERE j.id = c.id  -- (c is the row as locked: its state is the latest)
          AND (c.status = 'pending' OR (c.status = 'failed' AND c.retry_count < c.max_retries)) AND NOT c.delayed
        RETURNING j.*
    ), kind_started AS (
        INSERT INTO agora.kind_starts (kind, key, started_at)
        SELECT c.kind, {_KEY.format(payload="c.payload")}, c.started_at
        FROM claimed AS c JOIN agora.kind_limits AS l ON l.kind = c.kind
        WHERE l.rate IS NOT NULL
    ), queue_started AS (
        INSERT INTO agora.queue_starts (queue, started_at)
        SELECT c.queue, c.started_at FROM claimed AS c JOIN agora.queue_limits AS l ON l.queue = c.queue
        WHERE l.rate IS NOT NULL
    )
    SELECT * FROM claimed;
    taken_at := clock_timestamp();  -- (later than the claim's: a start it deletes is out of every later window)
    DELETE FROM agora.kind_starts AS s USING agora.kind_limits AS l
    WHERE s.kind = ANY(id_kinds) AND l.kind = s.kind
      AND s.started_at < taken_at - make_interval(secs => COALESCE(l.rate_seconds, 0));
    DELETE FROM agora.queue_starts AS s USING agora.queue_limits AS l
    WHERE s.queue = ANY(id_queues) AND l.queue = s.queue
      AND s.started_at < taken_at - make_interval(secs => COALESCE(l.rate_seconds, 0));
END
$$
"""

CLAIM_COMMENT = ("Claim up to wanted due jobs of the kinds a worker handles in its queues that a limit applies "
                 "to (those of a limited kind, or any in a limited queue), within every kind, key, queue and rate limit, "
                 "one job per key of fair share in turn from after_key; never waits on a lock.")


def upgrade() -> None:
    op.execute("DROP FUNCTION agora.limit_room(text[])")
    op.execute(LIMIT_ROOM)
    op.execute(QUEUE_ROOM)
    op.execute(CLAIM_LIMITED_JOBS)
    op.execute(f"COMMENT ON FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, "
               f"double precision, text) IS '{CLAIM_COMMENT}'")
    op.execute("COMMENT ON COLUMN agora.queue_starts.started_at IS 'When the claim started the job: the database''s "
               "clock once the claim held its locks, the instant its counts used.'")


def downgrade() -> None:
    op.execute("DROP FUNCTION agora.queue_room(text[], timestamptz)")
    op.execute("DROP FUNCTION agora.limit_room(text[], timestamptz)")
    for text in migration("0027_limit_bounds")._functions(keyed=True):  # (CREATE OR REPLACE each)
        op.execute(text)
