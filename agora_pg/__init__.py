"""agora-pg: a durable job queue and scheduler whose whole state lives in PostgreSQL.

Names are imported on first use, so that importing a pure module such as
``agora_pg.retry`` loads no database driver.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "AgoraError": "agora_pg.errors",
    "ConfigError": "agora_pg.errors",
    "DatabaseUnavailable": "agora_pg.errors",
    "EmbeddedPostgresMissing": "agora_pg.errors",
    "Fail": "agora_pg.errors",
    "InvalidJob": "agora_pg.errors",
    "InvalidTransition": "agora_pg.errors",
    "JobFailed": "agora_pg.errors",
    "JobNotFound": "agora_pg.errors",
    "Retry": "agora_pg.errors",
    "SchemaNotReady": "agora_pg.errors",
    "connect_db": "agora_pg.db.connect",
    "JobSpec": "agora_pg.job_spec",
    "Job": "agora_pg.jobs",
    "JobStatus": "agora_pg.jobs",
    "RunStatus": "agora_pg.jobs",
    "Queue": "agora_pg.queue",
    "Settings": "agora_pg.settings",
    "SyncQueue": "agora_pg.sync_queue",
    "load_settings": "agora_pg.settings",
    "Handler": "agora_pg.worker",
    "Handlers": "agora_pg.worker",
    "JobContext": "agora_pg.worker",
    "NoJobContext": "agora_pg.worker",
    "job_context": "agora_pg.worker",
    "Event": "agora_pg.events.model",
    "EventFilter": "agora_pg.events.model",
    "KindOptions": "agora_pg.worker",
    "UnknownJobKind": "agora_pg.worker",
    "Worker": "agora_pg.worker",
}

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
