"""The job worker and what it is built from."""

from agora_pg.worker.context import JobContext, NoJobContext, job_context
from agora_pg.worker.handlers import Handler, Handlers, KindOptions, UnknownJobKind
from agora_pg.worker.worker import Worker

__all__ = ["Handler", "Handlers", "JobContext", "KindOptions", "NoJobContext", "UnknownJobKind", "Worker",
           "job_context"]
