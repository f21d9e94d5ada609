"""A worker whose only handler does nothing: `agora-pg worker --module benchmarks.noop_worker`.

With ``BENCH_LIMIT_PER_KEY=N`` in its environment, its kind is limited to N running jobs
per payload ``key`` (``benchmarks.drain --limit-per-key``); with ``BENCH_RATE=N/SECONDS``,
to N starts in any SECONDS per payload ``key`` (``benchmarks.rate_limit``); with
``BENCH_QUEUE_LIMIT=N``, its queue (``default``) to N running jobs (``benchmarks.drain
--queue-limit``)."""

import os
from typing import Any

from agora_pg import Handlers, Job, Worker


async def noop(job: Job, resources: Any) -> None:
    return None


def get_worker() -> Worker:
    limit, rate = os.environ.get("BENCH_LIMIT_PER_KEY"), os.environ.get("BENCH_RATE")
    queue_limit = os.environ.get("BENCH_QUEUE_LIMIT")
    if not limit and not rate and not queue_limit:
        return Worker({"noop": noop})
    handlers = Handlers()
    if limit or rate:
        starts, _, seconds = (rate or "").partition("/")
        handlers.add("noop", noop, concurrency=int(limit) if limit else None, limit_by="key",
                     rate=(int(starts), float(seconds)) if rate else None)
    else:
        handlers.add("noop", noop)
    if queue_limit:
        handlers.queue("default", concurrency=int(queue_limit))
    return Worker(handlers)
