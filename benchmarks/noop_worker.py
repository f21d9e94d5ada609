"""A worker whose only handler does nothing: `agora-pg worker --module benchmarks.noop_worker`.

With ``BENCH_LIMIT_PER_KEY=N`` in its environment, its kind is limited to N running jobs
per payload ``key`` (``benchmarks.drain --limit-per-key``)."""

import os
from typing import Any

from agora_pg import Handlers, Job, Worker


async def noop(job: Job, resources: Any) -> None:
    return None


def get_worker() -> Worker:
    limit = os.environ.get("BENCH_LIMIT_PER_KEY")
    if not limit:
        return Worker({"noop": noop})
    handlers = Handlers()
    handlers.add("noop", noop, concurrency=int(limit), limit_by="key")
    return Worker(handlers)
