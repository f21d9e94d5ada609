"""SQL conditions on a job row that statements and partial indexes repeat verbatim:
plain text, so that the statements load without SQLAlchemy (``tables`` re-exports them)."""

from __future__ import annotations

# A job is claimable in this state; the claim query and the partial index repeat it verbatim.
CLAIMABLE = "status = 'pending' OR (status = 'failed' AND retry_count < max_retries)"
# Claimable and not waiting for its run_at: the claim index holds exactly these rows (a
# delayed job enters it when a worker's promotion step sees its run_at pass).
CLAIMABLE_NOW = f"({CLAIMABLE}) AND NOT delayed"
# A job still has work ahead of it: at most one such job per dedup_key.
ALIVE = (
    "dedup_key IS NOT NULL AND (status IN ('pending', 'processing') "
    "OR (status = 'failed' AND retry_count < max_retries))"
)
