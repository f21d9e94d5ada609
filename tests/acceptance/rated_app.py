"""A worker module of one kind limited by rate: ``agora-pg worker --module rated_app``.
At most 5 ``rated`` jobs start a second per payload ``key``, across every worker."""

from __future__ import annotations

from agora_pg import Handlers, Job, Worker

handlers = Handlers()


@handlers.kind("rated", rate=(5, 1.0), limit_by="key")
async def rated(job: Job, resources: object) -> None:
    return None


def get_worker() -> Worker:
    return Worker(handlers)
