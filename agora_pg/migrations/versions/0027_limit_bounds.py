"""Any key works, and limits stay within bounds.

A limit or fair-share key is a payload field's value of any length, but a key longer
than about 2.7 KB cannot be a B-tree entry (``jobs_fair_idx``, ``kind_starts_key_idx``):
its insert failed, and so did every claim or declaration that wrote it.
``agora.limit_key(value)`` is the key as stored and counted: the value itself up to 256
bytes, else its first 64 characters, an ellipsis and the MD5 of the whole value (one
key per value; the payload keeps the original). Every statement that derives a key
from a payload goes through it: the inserts (agora-pg's and ``agora.enqueue()``), a
declaration's keying of waiting jobs, ``agora.limit_room()`` and
``agora.claim_limited_jobs()``.

CHECK constraints hold the bounds of ``agora_pg/limits.py`` for limits written any
other way: concurrency and a rate's starts from 1 to 1,000,000, a rate's window from
0.001 to 86,400 seconds (NaN and infinity excluded), field names of at most 200
characters, queue names of at most 100. Rows outside them, which made every claim fail,
are deleted first (a worker or config declaring them again is refused at start with
the key path that is wrong).

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from __future__ import annotations

from alembic import op

from agora_pg.migrations.earlier import migration

revision = "0027"
down_revision = "0026"
branch_labels = None
depends_on = None

LIMIT_KEY = """
CREATE FUNCTION agora.limit_key(value text) RETURNS text LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE WHEN octet_length(value) <= 256 THEN value ELSE left(value, 64) || '…' || md5(value) END
$$
"""
LIMIT_KEY_COMMENT = ("A limit or fair-share key as stored and counted: the payload value itself up to 256 bytes, "
                     "else its first 64 characters, an ellipsis and the MD5 of the whole value.")

KIND_BOUNDS = ("(concurrency IS NULL OR concurrency <= 1000000) AND (rate IS NULL OR (rate <= 1000000 AND "
               "rate_seconds BETWEEN 0.001 AND 86400)) AND (limit_by IS NULL OR length(limit_by) <= 200) "
               "AND (fair_by IS NULL OR length(fair_by) <= 200)")
QUEUE_BOUNDS = ("(concurrency IS NULL OR concurrency <= 1000000) AND (rate IS NULL OR (rate <= 1000000 AND "
                "rate_seconds BETWEEN 0.001 AND 86400)) AND length(queue) <= 100")

# (each earlier text, and what this revision makes of it)
_KEYED = [
    ("0016_rate_limits", "LIMIT_ROOM", "COALESCE(j.payload->>l.limit_by, '')",
     "COALESCE(agora.limit_key(j.payload->>l.limit_by), '')"),
    ("0017_fair_share", "CLAIM_LIMITED_JOBS", "COALESCE(d.payload->>l.limit_by, '')",
     "COALESCE(agora.limit_key(d.payload->>l.limit_by), '')"),
    ("0017_fair_share", "CLAIM_LIMITED_JOBS", "COALESCE(c.payload->>l.limit_by, '')",
     "COALESCE(agora.limit_key(c.payload->>l.limit_by), '')"),
    ("0026_kinds", "ENQUEUE", "(SELECT enqueue.payload ->> COALESCE(l.fair_by, l.limit_by)",
     "(SELECT agora.limit_key(enqueue.payload ->> COALESCE(l.fair_by, l.limit_by))"),
]


def _functions(keyed: bool) -> list[str]:
    """The functions that derive keys, as this revision (``keyed``) or the one before has them."""
    texts: dict[tuple[str, str], str] = {}
    for module, name, before, after in _KEYED:
        text = texts.get((module, name)) or getattr(migration(module), name)
        assert before in text, (module, name, before)
        texts[module, name] = text.replace(before, after) if keyed else text
    return [text.replace("CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1) for text in texts.values()]


def upgrade() -> None:
    op.execute(LIMIT_KEY)
    op.execute(f"COMMENT ON FUNCTION agora.limit_key(text) IS '{LIMIT_KEY_COMMENT}'")
    for text in _functions(keyed=True):
        op.execute(text)
    op.execute("UPDATE agora.jobs SET fair_key = agora.limit_key(fair_key) WHERE octet_length(fair_key) > 256")
    op.execute("UPDATE agora.kind_starts SET key = agora.limit_key(key) WHERE octet_length(key) > 256")
    op.execute(f"DELETE FROM agora.kind_limits WHERE NOT ({KIND_BOUNDS})")
    op.execute(f"DELETE FROM agora.queue_limits WHERE NOT ({QUEUE_BOUNDS})")
    op.create_check_constraint("kind_limits_within_bounds", "kind_limits", KIND_BOUNDS, schema="agora")
    op.create_check_constraint("queue_limits_within_bounds", "queue_limits", QUEUE_BOUNDS, schema="agora")


def downgrade() -> None:
    op.drop_constraint("queue_limits_within_bounds", "queue_limits", schema="agora")
    op.drop_constraint("kind_limits_within_bounds", "kind_limits", schema="agora")
    for text in _functions(keyed=False):
        op.execute(text)
    op.execute("DROP FUNCTION agora.limit_key(text)")
