"""The limited claim runs without JIT compilation, and counts no further than a limit needs.

``agora.claim_limited_jobs`` plans its statements once per session, as generic plans
(0029). A generic plan cannot know how many queues, kinds and keys a call passes, so
its cost estimates grow with the table's statistics: on a server with JIT available
(``jit = on`` is PostgreSQL's default where LLVM is installed), once the jobs table had
seen a few hundred thousand rows the claim's estimated cost passed ``jit_above_cost``,
and then ``jit_optimize_above_cost``. Every claim then compiled its plan first: 30 ms,
and later 450 ms, for a claim that runs in 3 ms. A claim reads a few hundred rows by
index; compiling never pays off. The room functions it calls run inside it and inherit
the setting; they are set too, for a call of their own (the dashboard's).

Its check for kinds near a limit counted all of a kind's running jobs (and its starts
in a rate's window) at every claim. It now stops counting one past what decides it:
a kind is near its limit of ``n`` when more than ``n - wanted`` of its jobs run, so it
counts at most ``n - wanted + 1`` (none, when ``wanted`` alone passes the limit). On a
server whose autovacuum has not yet cleared the finished jobs' index entries, a full
count of a drain's 500 running jobs read a few hundred index pages.

Revision ID: 0030
Revises: 0029
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0030"
down_revision = "0029"
branch_labels = None
depends_on = None

_COUNTED_IN_FULL = """(
                 l.concurrency < wanted + (SELECT count(*) FROM agora.jobs AS j
                                           WHERE j.status = 'processing' AND j.kind = l.kind)
                 OR l.rate < wanted + (SELECT count(*) FROM agora.kind_starts AS s WHERE s.kind = l.kind
                                       AND s.started_at > clock_timestamp() - make_interval(secs => l.rate_seconds))
             )"""
_COUNTED_AS_FAR_AS_NEEDED = """(  -- (counted one past what decides it, no further; a limit not set: not counted)
                 l.concurrency < wanted + (SELECT count(*) FROM (
                     SELECT FROM agora.jobs AS j WHERE j.status = 'processing' AND j.kind = l.kind
                     LIMIT COALESCE(greatest(l.concurrency - wanted + 1, 0), 0)) AS running)
                 OR l.rate < wanted + (SELECT count(*) FROM (
                     SELECT FROM agora.kind_starts AS s WHERE s.kind = l.kind
                       AND s.started_at > clock_timestamp() - make_interval(secs => l.rate_seconds)
                     LIMIT COALESCE(greatest(l.rate - wanted + 1, 0), 0)) AS started)
             )"""

CLAIM_BEFORE = migration("0029_claim_under_kind_locks").CLAIM_LIMITED_JOBS
FUNCTIONS = (
    "agora.claim_limited_jobs(text[], text[], integer, integer, text, double precision, text)",
    "agora.limit_room(text[], timestamptz)",
    "agora.queue_room(text[], timestamptz)",
)


def upgrade() -> None:
    assert _COUNTED_IN_FULL in CLAIM_BEFORE
    op.execute(CLAIM_BEFORE.replace(_COUNTED_IN_FULL, _COUNTED_AS_FAR_AS_NEEDED))
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} SET jit = off")


def downgrade() -> None:
    op.execute(CLAIM_BEFORE)
    for function in FUNCTIONS:
        op.execute(f"ALTER FUNCTION {function} RESET jit")
