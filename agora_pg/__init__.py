"""agora-pg: a durable job queue and scheduler whose whole state lives in PostgreSQL.

Names are imported on first use, so that importing a pure module such as
``agora_pg.retry`` loads no database driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_MODULES = {  # (the same names as the TYPE_CHECKING imports below, which type checkers read)
    "agora_pg.errors": ("AgoraError", "ConfigError", "DatabaseUnavailable", "EmbeddedPostgresMissing", "Fail",
                        "InvalidJob", "InvalidTransition", "JobFailed", "JobNotFound", "Retry", "SchemaNotReady"),
    "agora_pg.db.connect": ("connect_db",),
    "agora_pg.job_spec": ("JobSpec",),
    "agora_pg.jobs": ("Job", "JobStatus", "RunStatus"),
    "agora_pg.queue": ("Queue",),
    "agora_pg.settings": ("Settings", "load_settings"),
    "agora_pg.sync_queue": ("SyncQueue",),
    "agora_pg.events.model": ("Event", "EventFilter"),
    "agora_pg.worker": ("Handler", "Handlers", "JobContext", "KindOptions", "NoJobContext", "UnknownJobKind",
                        "Worker", "job_context"),
}
_EXPORTS = {name: module for module, names in _MODULES.items() for name in names}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'agora_pg' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


if TYPE_CHECKING:
    from agora_pg.errors import (
        AgoraError,
        ConfigError,
        DatabaseUnavailable,
        EmbeddedPostgresMissing,
        Fail,
        InvalidJob,
        InvalidTransition,
        JobFailed,
        JobNotFound,
        Retry,
        SchemaNotReady,
    )
    from agora_pg.db.connect import connect_db
    from agora_pg.job_spec import JobSpec
    from agora_pg.jobs import Job, JobStatus, RunStatus
    from agora_pg.queue import Queue
    from agora_pg.settings import Settings, load_settings
    from agora_pg.sync_queue import SyncQueue
    from agora_pg.events.model import Event, EventFilter
    from agora_pg.worker import Handler, Handlers, JobContext, KindOptions, NoJobContext, UnknownJobKind, Worker, job_context
