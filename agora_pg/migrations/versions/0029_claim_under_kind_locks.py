"""The limited claim locks each limited kind and queue it takes from, then counts and
claims in one statement: far from a limit, close to the cost of the plain claim.

Migration 0028's claim read the due jobs twice: once to learn which keys and queues to
lock, then, under those locks, again by id to count and claim. Each claim counted every
running job of its kinds by key, even when no key could reach its limit. Measured by
``benchmarks.drain`` (100,000 jobs, concurrency 500), a never-reached queue limit
drained at 0.57x the unlimited drain, a never-reached per-key limit at 0.41x.

Now ``agora.claim_limited_jobs`` (same arguments, same rows):

1. takes a transaction-scoped advisory lock on each limited kind and each limited queue
   of the worker's (``pg_try_advisory_xact_lock``), leaving out those another claim
   holds: a held lock means "take other work", never "wait";
2. with the locks held, finds the kinds near a limit: the kind's running jobs, or its
   starts in the window, plus the jobs wanted, pass it. Their room is counted (by key
   for a per-key limit: no key of a kind far from its limit can reach it, so a kind
   far from its limits takes its jobs in claim order, uncounted). The jobs of a kind
   near a per-key limit, and of a kind shared by key (``fair_by``), are taken key by key;
3. visits the keys of the first kinds, from ``after_key`` on, as before;
4. in one statement, reads each (queue, kind) pair's first due jobs, locking them
   (``FOR UPDATE SKIP LOCKED``), counts the room of each counted kind or key and of
   each queue, and claims what fits: ``started_at`` and the starts a rate counts are
   the statement's clock, read after the snapshot its counts use. With no kind near a
   limit or shared by key, that statement has the plain claim's shape (each pair's
   first jobs, within each limited queue's room).

Its statements are planned once per session (``plan_cache_mode = force_generic_plan``):
planned again at each call, as PostgreSQL chose for them, they cost more than the claim
itself. Each plan is one that no estimate can turn into a scan of the jobs: rows are
reached by index, the claimed ones by primary key.

A claim holds a kind's or a queue's lock for one statement; it commits with the
statement that called it, so a worker frozen or cut off after it holds nothing.

Revision ID: 0029
Revises: 0028
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0029"
down_revision = "0028"
branch_labels = None
depends_on = None

NO_LIMIT = 2147483647  # the room of a limit not set
_CLAIMABLE_NOW = ("(j.status = 'pending' OR (j.status = 'failed' AND j.retry_count < j.max_retries)) "
                  "AND NOT j.delayed AND j.run_at <= now()")
_KEY = "COALESCE(agora.limit_key({payload}->>l.limit_by), '')"

# The end of both claim statements: claim the rows of ``fitting`` (locked by the statement,
# due as locked: their latest state), stamped with ``taken``, and record their starts.
_CLAIM_FITTING = rf"""    ), claimed AS (  -- (each row is locked and was due as locked: its latest state)
        UPDATE agora.jobs AS j
        SET status = 'processing', started_at = (SELECT t.taken_at FROM taken AS t), finished_at = NULL, locked_by = worker,
            lease_expires_at = CASE WHEN (SELECT w.lease_expires_at FROM agora.workers AS w WHERE w.id = worker) > now()
                                    THEN NULL ELSE now() + make_interval(secs => lease_seconds) END,
            attempt = j.attempt + 1, cancel_requested_at = NULL, progress = NULL
        WHERE j.id = ANY(ARRAY(SELECT fitting.id FROM fitting))  -- (by the primary key, whatever the estimates)
        RETURNING j.*
    ), kind_started AS (
        INSERT INTO agora.kind_starts (kind, key, started_at)
        SELECT c.kind, {_KEY.format(payload="c.payload")}, c.started_at
        FROM claimed AS c JOIN agora.kind_limits AS l ON l.kind = c.kind
        WHERE kinds_rated AND l.rate IS NOT NULL  -- (not even read without a rate)
    ), queue_started AS (
        INSERT INTO agora.queue_starts (queue, started_at)
        SELECT c.queue, c.started_at FROM claimed AS c JOIN agora.queue_limits AS l ON l.queue = c.queue
        WHERE queues_rated AND l.rate IS NOT NULL
    )
    SELECT * FROM claimed"""

# 4, when no kind is counted or taken by key (far from every kind's limit): each pair's
# first jobs in claim order, within each limited queue's room: the plain claim's shape.
_LEAN_CLAIM = rf"""
    WITH taken AS MATERIALIZED (  -- (read after this statement's snapshot: see 0028)
        SELECT clock_timestamp() AS taken_at
    ), queue_free AS MATERIALIZED (  -- (not even called without a limited queue)
        SELECT * FROM agora.queue_room(limited_queues, (SELECT t.taken_at FROM taken AS t))
        WHERE cardinality(limited_queues) > 0
    ), due AS (
        SELECT best.* FROM unnest(queues) AS q(name) CROSS JOIN unnest(kinds) AS k(name)
        CROSS JOIN LATERAL (
            SELECT j.id, j.queue, j.priority, j.run_at FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = q.name AND j.kind = k.name
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT wanted
            FOR UPDATE OF j SKIP LOCKED
        ) AS best
        WHERE (k.name = ANY(limited_kinds) OR q.name = ANY(limited_queues))
          AND k.name <> ALL(busy_kinds) AND q.name <> ALL(busy_queues)
    ), fitting AS (
        SELECT d.id FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.queue ORDER BY d.priority DESC, d.run_at, d.id) AS queue_rank
            FROM due AS d
        ) AS d
        LEFT JOIN queue_free AS f ON f.queue = d.queue
        WHERE f.queue IS NULL OR d.queue_rank <= f.room
        ORDER BY d.priority DESC, d.run_at, d.id
        LIMIT wanted
{_CLAIM_FITTING}"""

CLAIM_LIMITED_JOBS = rf"""
CREATE OR REPLACE FUNCTION agora.claim_limited_jobs(
    queues text[], kinds text[], scan integer, wanted integer, worker text, lease_seconds double precision,
    after_key text
) RETURNS SETOF agora.jobs LANGUAGE plpgsql VOLATILE SET plan_cache_mode = force_generic_plan AS $$
DECLARE
    limited_kinds text[];  -- of kinds, those with flow control whose lock this claim holds
    busy_kinds text[];  -- those whose lock another claim holds: left for later
    limited_queues text[];  -- of queues, those with limits whose lock this claim holds
    busy_queues text[];
    kinds_rated boolean;  -- whether a kind (queue) locked has a rate: its old starts are deleted
    queues_rated boolean;
    keyed_kinds text[];  -- of limited_kinds, those whose jobs are taken key by key
    counted_kinds text[];  -- of limited_kinds, those near a limit: their room is counted (by key if keyed)
    fair_queues text[] := '{{}}';
    fair_keys text[] := '{{}}';
    queue_name text;
    previous text;
    found_key text;
    wrapped boolean;
    key_budget integer := greatest(2 * wanted, 20);  -- keys visited at most (some may be full)
    per_key integer;
BEGIN
    -- 1. The locks (in name order; a lock held elsewhere is skipped, never waited for).
    SELECT COALESCE(array_agg(l.kind) FILTER (WHERE l.locked), '{{}}'),
           COALESCE(array_agg(l.kind) FILTER (WHERE NOT l.locked), '{{}}'),
           COALESCE(bool_or(l.rate IS NOT NULL) FILTER (WHERE l.locked), false)
    INTO limited_kinds, busy_kinds, kinds_rated
    FROM (SELECT l.kind, l.rate, pg_try_advisory_xact_lock(6383468, hashtext(l.kind)) AS locked
          FROM agora.kind_limits AS l WHERE l.kind = ANY(kinds) ORDER BY l.kind) AS l;
    SELECT COALESCE(array_agg(l.queue) FILTER (WHERE l.locked), '{{}}'),
           COALESCE(array_agg(l.queue) FILTER (WHERE NOT l.locked), '{{}}'),
           COALESCE(bool_or(l.rate IS NOT NULL) FILTER (WHERE l.locked), false)
    INTO limited_queues, busy_queues, queues_rated
    FROM (SELECT l.queue, l.rate, pg_try_advisory_xact_lock(6383469, hashtext(l.queue)) AS locked
          FROM agora.queue_limits AS l WHERE l.queue = ANY(queues) ORDER BY l.queue) AS l;
    IF cardinality(limited_kinds) = 0 AND cardinality(limited_queues) = 0 THEN
        RETURN;
    END IF;

    -- 2. Under the locks (this statement's snapshot is taken after them): the kinds near a
    -- limit (their running jobs, or starts in the window, plus the jobs wanted, pass it),
    -- whose room is counted, and the kinds taken key by key: those shared by key, and
    -- those near a per-key limit. A kind far from its limits takes jobs in claim order,
    -- uncounted: no claim of it but this one can run until this one commits.
    SELECT COALESCE(array_agg(l.kind) FILTER (WHERE l.fair_by IS NOT NULL OR (l.limit_by IS NOT NULL AND l.near)), '{{}}'),
           COALESCE(array_agg(l.kind) FILTER (WHERE l.near), '{{}}')
    INTO keyed_kinds, counted_kinds
    FROM (SELECT l.*, (
                 l.concurrency < wanted + (SELECT count(*) FROM agora.jobs AS j
                                           WHERE j.status = 'processing' AND j.kind = l.kind)
                 OR l.rate < wanted + (SELECT count(*) FROM agora.kind_starts AS s WHERE s.kind = l.kind
                                       AND s.started_at > clock_timestamp() - make_interval(secs => l.rate_seconds))
             ) IS TRUE AS near
          FROM agora.kind_limits AS l WHERE l.kind = ANY(limited_kinds)) AS l;

    -- 3. The keys with due jobs of the keyed kinds, in key order from after_key, wrapping around.
    IF cardinality(keyed_kinds) > 0 THEN
        FOREACH queue_name IN ARRAY queues LOOP
            CONTINUE WHEN queue_name = ANY(busy_queues);
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

    -- 4. Read and lock the due jobs, count, claim what fits.
    IF cardinality(keyed_kinds) = 0 AND cardinality(counted_kinds) = 0 THEN
        RETURN QUERY {_LEAN_CLAIM};
    ELSE
    RETURN QUERY
    WITH taken AS MATERIALIZED (  -- (read after this statement's snapshot: see 0028)
        SELECT clock_timestamp() AS taken_at
    ), pairs AS (  -- each (queue, kind) a limit applies to whose locks this claim holds
        SELECT q.name AS queue, k.name AS kind, k.name = ANY(keyed_kinds) AS keyed,
               CASE WHEN k.name = ANY(keyed_kinds) THEN greatest(scan, wanted) ELSE wanted END AS depth
        FROM unnest(queues) AS q(name) CROSS JOIN unnest(kinds) AS k(name)
        WHERE (k.name = ANY(limited_kinds) OR q.name = ANY(limited_queues))
          AND k.name <> ALL(busy_kinds) AND q.name <> ALL(busy_queues)
    ), first_due AS (  -- of the kinds not taken by key: each pair's first jobs, in claim order
        SELECT best.* FROM (SELECT * FROM pairs WHERE NOT pairs.keyed) AS p
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.queue, j.payload, j.priority, j.run_at FROM agora.jobs AS j
            WHERE {_CLAIMABLE_NOW} AND j.queue = p.queue AND j.kind = p.kind
            ORDER BY j.priority DESC, j.run_at, j.id
            LIMIT p.depth
            FOR UPDATE OF j SKIP LOCKED
        ) AS best
    ), unkeyed AS (  -- of the kinds taken by key, the jobs without one among each pair's first
        SELECT j.id, j.kind, j.queue, j.payload, j.priority, j.run_at FROM (
            -- (read by id alone, its state tested on the row as locked: with the state in the
            -- same WHERE, pushed there without OFFSET 0, a planner without statistics scans
            -- the claim index for the ids)
            SELECT j.* FROM agora.jobs AS j
            WHERE j.id = ANY(ARRAY(
                SELECT best.id FROM (SELECT * FROM pairs WHERE pairs.keyed) AS p
                CROSS JOIN LATERAL (
                    SELECT j.id, j.fair_key FROM agora.jobs AS j
                    WHERE {_CLAIMABLE_NOW} AND j.queue = p.queue AND j.kind = p.kind
                    ORDER BY j.priority DESC, j.run_at, j.id
                    LIMIT p.depth
                ) AS best
                WHERE best.fair_key IS NULL))
            OFFSET 0
            FOR UPDATE OF j SKIP LOCKED
        ) AS j
        WHERE {_CLAIMABLE_NOW}
    ), headed AS (
        SELECT d.*, row_number() OVER (ORDER BY d.priority DESC, d.run_at, d.id) AS turn
        FROM (SELECT * FROM first_due UNION ALL SELECT * FROM unkeyed) AS d
    ), keyed AS (  -- the first jobs of each key visited: turn n takes each key's n-th job
        SELECT best.id, best.kind, best.queue, best.payload, best.priority, best.run_at,
               (best.rank - 1) * cardinality(fair_keys) + v.position AS turn
        FROM unnest(fair_queues, fair_keys) WITH ORDINALITY AS v(queue, fair_key, position)
        CROSS JOIN LATERAL (
            SELECT j.id, j.kind, j.queue, j.payload, j.priority, j.run_at,
                   row_number() OVER (ORDER BY j.priority DESC, j.run_at, j.id) AS rank
            FROM (SELECT j.* FROM agora.jobs AS j
                  WHERE {_CLAIMABLE_NOW} AND j.queue = v.queue AND j.fair_key = v.fair_key AND j.kind = ANY(keyed_kinds)
                  ORDER BY j.priority DESC, j.run_at, j.id
                  LIMIT per_key
                  FOR UPDATE OF j SKIP LOCKED) AS j
        ) AS best
    ), due AS (
        SELECT d.id, d.kind, d.queue, d.priority, d.run_at, d.turn,
               CASE WHEN d.kind = ANY(counted_kinds) THEN {_KEY.format(payload="d.payload")} ELSE '' END AS key,
               d.kind = ANY(counted_kinds) AS counted,
               COALESCE(LEAST(COALESCE(l.concurrency, {NO_LIMIT}), COALESCE(l.rate, {NO_LIMIT})), {NO_LIMIT}) AS kind_limit_room,
               d.queue = ANY(limited_queues) AS queue_limited
        FROM (SELECT * FROM headed UNION ALL SELECT * FROM keyed) AS d
        LEFT JOIN agora.kind_limits AS l ON l.kind = d.kind
    ), free AS MATERIALIZED (  -- once, whatever the row estimates (never once per due job)
        SELECT * FROM agora.limit_room(counted_kinds, (SELECT t.taken_at FROM taken AS t))
        WHERE cardinality(counted_kinds) > 0
    ), queue_free AS MATERIALIZED (
        SELECT * FROM agora.queue_room(limited_queues, (SELECT t.taken_at FROM taken AS t))
        WHERE cardinality(limited_queues) > 0
    ), kind_fitting AS (
        SELECT d.* FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.kind, d.key ORDER BY d.turn, d.priority DESC, d.run_at, d.id)
                   AS kind_rank
            FROM due AS d
        ) AS d
        LEFT JOIN free AS f ON f.kind = d.kind AND f.key = d.key
        WHERE NOT d.counted OR d.kind_rank <= COALESCE(f.room, d.kind_limit_room)
    ), fitting AS (
        SELECT d.id FROM (
            SELECT d.*, row_number() OVER (PARTITION BY d.queue ORDER BY d.turn, d.priority DESC, d.run_at, d.id)
                   AS queue_rank
            FROM kind_fitting AS d
        ) AS d
        LEFT JOIN queue_free AS f ON f.queue = d.queue
        WHERE NOT d.queue_limited OR d.queue_rank <= f.room
        ORDER BY d.turn, d.priority DESC, d.run_at, d.id
        LIMIT wanted
{_CLAIM_FITTING};
    END IF;

    -- Starts older than their window (later than the claim's clock: out of every later window).
    IF kinds_rated THEN
        DELETE FROM agora.kind_starts AS s USING agora.kind_limits AS l
        WHERE s.kind = ANY(limited_kinds) AND l.kind = s.kind AND l.rate IS NOT NULL
          AND s.started_at < clock_timestamp() - make_interval(secs => l.rate_seconds);
    END IF;
    IF queues_rated THEN
        DELETE FROM agora.queue_starts AS s USING agora.queue_limits AS l
        WHERE s.queue = ANY(limited_queues) AND l.queue = s.queue AND l.rate IS NOT NULL
          AND s.started_at < clock_timestamp() - make_interval(secs => l.rate_seconds);
    END IF;
END
$$
"""



def _cached(function: str, guard: str) -> str:
    """An earlier SQL function of 0028 as a PL/pgSQL one with the same body: its plan is
    made once per session, not at each call (a claim spent 2 ms planning the two), and
    a call with no ``guard`` names returns at once."""
    head, body, tail = function.split("$$")
    head = head.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION").replace("LANGUAGE sql", "LANGUAGE plpgsql")
    return (f"{head}$$\n#variable_conflict use_column\nBEGIN\n    IF cardinality({guard}) = 0 THEN\n"
            f"        RETURN;\n    END IF;\n    RETURN QUERY{body};\nEND\n$${tail}")


CLAIM_COMMENT = ("Claim up to wanted due jobs of the kinds a worker handles in its queues that a limit applies "
                 "to (those of a limited kind, or any in a limited queue), within every kind, key, queue and rate limit, "
                 "one job per key of fair share in turn from after_key; each limited kind and queue is locked for the "
                 "claim, and one another claim holds is left for later: it never waits on a lock.")


def upgrade() -> None:
    before = migration("0028_one_limited_claim")
    op.execute(_cached(before.LIMIT_ROOM, "kinds"))
    op.execute(_cached(before.QUEUE_ROOM, "queues"))
    op.execute(CLAIM_LIMITED_JOBS)
    op.execute(f"COMMENT ON FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, "
               f"double precision, text) IS '{CLAIM_COMMENT}'")


def downgrade() -> None:
    before = migration("0028_one_limited_claim")
    for name in ("limit_room(text[], timestamptz)", "queue_room(text[], timestamptz)"):
        op.execute(f"DROP FUNCTION agora.{name}")
    op.execute(before.LIMIT_ROOM)
    op.execute(before.QUEUE_ROOM)
    op.execute(before.CLAIM_LIMITED_JOBS)
    op.execute(f"COMMENT ON FUNCTION agora.claim_limited_jobs(text[], text[], integer, integer, text, "
               f"double precision, text) IS '{before.CLAIM_COMMENT}'")
