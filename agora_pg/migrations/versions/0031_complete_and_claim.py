"""A batch's successes and the worker's next batch in one call: ``agora.complete_and_claim``.

At a worker's default concurrency of 10, each batch cost two statements, each with a
durable commit: the claim, then the statement that records the batch's successes. The
function runs both, in that call's one transaction: ``queries.COMPLETE_SUCCEEDED``, then
``queries.CLAIM_JOBS`` (see ``queries.COMPLETE_AND_CLAIM_FUNCTION``, the text it is
created from). Written as one SQL statement, the two were planned again at each call,
and the planning cost more than the commit saved (an experiment of this issue drained
0.94x at concurrency 10): in PL/pgSQL their plans are made once per session, generic
(``plan_cache_mode = force_generic_plan``), without sequential scans (``enable_seqscan =
off``: a plan made while the table was empty would otherwise scan it at every call once
it has grown) and without JIT. A claim updates its rows by primary key whatever the
estimates. Drains alternated with the code before: 2.33x at 1 slot, 1.57x at 10, 1.16x
at 100 (the worker uses it up to 100 slots).

The text comes from ``agora_pg.db.queries``: ``COMPLETE_AND_CLAIM_SHA256`` records the
one this migration was written for, and a test holds the latest migration that records
one to the text the code builds now. A change to either statement therefore comes with a
migration that creates the function again. (A PL/pgSQL body's tables and columns are
resolved when it runs, not when it is created, so a fresh database that runs this
migration before a later one's columns exist is fine.)

Revision ID: 0031
Revises: 0030
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from agora_pg.db import queries

revision = "0031"
down_revision = "0030"
branch_labels = None
depends_on = None

COMPLETE_AND_CLAIM_SHA256 = "9689a9afedcafdccbf48aee637deed4839abca61da7b5bb274380b4137c171b8"
COMMENT = ("A worker''s batch of successes recorded (COMPLETE_SUCCEEDED) and its next batch claimed (CLAIM_JOBS) "
           "in one transaction; rows: (job id, NULL) per outcome recorded, then (NULL, job) per job claimed.")
SIGNATURE = ("agora.complete_and_claim(bigint[], integer[], text, text[], text[], integer, double precision, "
             "boolean, integer, text[])")


def upgrade() -> None:
    op.execute(queries.COMPLETE_AND_CLAIM_FUNCTION)
    op.execute(f"COMMENT ON FUNCTION {SIGNATURE} IS '{COMMENT}'")


def downgrade() -> None:
    op.execute(f"DROP FUNCTION {SIGNATURE}")
