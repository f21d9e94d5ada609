"""A small project's worker module: the handlers its tests below exercise."""

from __future__ import annotations

from typing import Any

from agora_pg import Fail, Handlers, Job

handlers = Handlers()


@handlers.kind("add")
async def add(job: Job, resources: Any) -> dict[str, int]:
    return {"sum": job.payload["a"] + job.payload["b"]}


@handlers.kind("charge", non_retryable=(KeyError,))
def charge(job: Job, resources: Any) -> str:  # a sync handler
    if job.payload["amount"] <= 0:
        raise Fail("amount must be positive")
    return f"charged {job.payload['amount']}"


@handlers.kind("fan_out")
async def fan_out(job: Job, resources: Any) -> int:
    """Enqueues one ``add`` job per pair: run_until_idle runs those too."""
    pairs = job.payload["pairs"]
    for a, b in pairs:
        await resources.enqueue("add", {"a": a, "b": b})
    return len(pairs)
