"""A worker whose only handler does nothing: `agora-pg worker --module benchmarks.noop_worker`."""

from typing import Any

from agora_pg import Job, Worker


async def noop(job: Job, resources: Any) -> None:
    return None


def get_worker() -> Worker:
    return Worker({"noop": noop})
