"""A worker module with rate limits: ``agora-pg worker --module rated_app``. At most 5
``rated`` jobs start a second per payload ``key``, and at most 5 jobs of the queue
``paced`` (kinds ``plain`` and ``other``, unlimited themselves), across every worker."""

from __future__ import annotations

from agora_pg import Handlers, Job, Worker

handlers = Handlers()
handlers.queue("paced", rate=(5, 1.0))


@handlers.kind("rated", rate=(5, 1.0), limit_by="key")
async def rated(job: Job, resources: object) -> None:
    return None


@handlers.kind("plain")
@handlers.kind("other")
async def plain(job: Job, resources: object) -> None:
    return None


def get_worker() -> Worker:
    return Worker(handlers)
