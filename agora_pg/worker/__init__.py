"""The job worker and what it is built from."""

from agora_pg.worker.dispatch import Handler, UnknownJobKind
from agora_pg.worker.worker import Worker, check_schema

__all__ = ["Handler", "UnknownJobKind", "Worker", "check_schema"]
