"""A worker module with rate limits: ``agora-pg worker --module rated_app``. At most 5
``rated`` jobs start a second per payload ``key``, and at most 5 jobs of the queue
``paced`` (kinds ``plain`` and ``other``, unlimited themselves), across every worker.
Each handler appends ``job_id time`` (its own start, by this host's clock) to
``$RATED_STARTS_DIR/<pid>``."""

from __future__ import annotations

import os
import time

from agora_pg import Handlers, Job, Worker

handlers = Handlers()
handlers.queue("paced", rate=(5, 1.0))


@handlers.kind("rated", rate=(5, 1.0), limit_by="key")
async def rated(job: Job, resources: object) -> None:
    _record(job)


@handlers.kind("plain")
@handlers.kind("other")
async def plain(job: Job, resources: object) -> None:
    _record(job)


def _record(job: Job) -> None:
    with open(os.path.join(os.environ["RATED_STARTS_DIR"], str(os.getpid())), "a", encoding="utf-8") as starts:
        starts.write(f"{job.id} {time.time():.6f}\n")


def get_worker() -> Worker:
    return Worker(handlers)
