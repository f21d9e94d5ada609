"""The job worker and what it is built from."""

from agora_pg.worker.handlers import Handler, Handlers, KindOptions, UnknownJobKind
from agora_pg.worker.worker import Worker

__all__ = ["Handler", "Handlers", "KindOptions", "UnknownJobKind", "Worker"]
