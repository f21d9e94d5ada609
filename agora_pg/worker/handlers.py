"""Handlers by kind, and the options a kind is registered with."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from agora_pg.db.job_rows import DeclaredKind
from agora_pg.errors import AgoraError, InvalidJob
from agora_pg.job_spec import JobSpec, refuse_reserved_queue
from agora_pg.jobs import Job
from agora_pg.limits import InvalidLimit, KindLimit, QueueLimit
from agora_pg.payloads import check_payload, is_payload_type

Handler = Callable[[Job, Any], Awaitable[Any] | Any]


class UnknownJobKind(AgoraError):
    """A worker holds a job of a kind it has no handler for (its claim takes only the kinds
    it handles, so this is a bug); the attempt fails."""

    def __init__(self, kind: str) -> None:
        super().__init__(f"no handler registered for kind {kind!r} on this worker")
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class KindOptions:
    """Options of one kind. ``timeout``: seconds an attempt may run (a job's own
    ``timeout_seconds`` wins; None takes ``WORKER_JOB_TIMEOUT``). ``non_retryable``:
    exception types that fail the job at once, like ``agora_pg.Fail``. ``max_retries``
    and ``queue``: what a job of this kind gets when its enqueue names none (through a
    ``Queue``, ``SyncQueue`` or API that knows the kinds). ``retry_backoff``: base
    seconds of the retry delay (``WORKER_RETRY_BACKOFF_SECONDS`` otherwise).
    ``payload``: a dataclass or ``msgspec.Struct`` the payload must decode into; the
    handler's ``job.payload`` is then an instance of it. ``concurrency``: at most this many
    of the kind's jobs run at once across every worker, or of each key's with
    ``limit_by``, the payload field whose value is the key (jobs without it share one).
    ``rate``: ``(n, seconds)``, at most n of the kind's jobs (or of each key's) start in
    any ``seconds``, by the database's clock. ``fair_by``: the payload field whose value
    is the key the kind's jobs are shared by: a claim takes one job per key in turn, so a
    key with many jobs waiting never holds back one with few (``limit_by`` does the same
    when ``fair_by`` is not given)."""

    timeout: float | None = None
    non_retryable: tuple[type[BaseException], ...] = ()
    max_retries: int | None = None
    retry_backoff: float | None = None
    queue: str | None = None
    payload: type | None = None
    concurrency: int | None = None
    limit_by: str | None = None
    rate: tuple[int, float] | None = None
    fair_by: str | None = None

    def __post_init__(self) -> None:
        if self.timeout is not None and not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        for error_type in self.non_retryable:
            if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
                raise TypeError(f"non_retryable takes exception types, got {error_type!r}")
        if self.max_retries is not None and (isinstance(self.max_retries, bool)
                                             or not isinstance(self.max_retries, int) or self.max_retries < 0):
            raise ValueError(f"max_retries must be a whole number >= 0, got {self.max_retries!r}")
        if self.retry_backoff is not None and (isinstance(self.retry_backoff, bool)
                                               or not isinstance(self.retry_backoff, int | float)
                                               or self.retry_backoff < 0):
            raise ValueError(f"retry_backoff must be a number of seconds >= 0, got {self.retry_backoff!r}")
        if self.queue is not None:
            refuse_reserved_queue(JobSpec("kind", queue=self.queue))  # the queue's rules are a public job's
        if self.payload is not None and not is_payload_type(self.payload):
            raise TypeError(f"payload must be a dataclass or a msgspec.Struct class, got {self.payload!r}")
        self.limit()  # (InvalidLimit, naming the option, if out of bounds)

    def limit(self) -> KindLimit:
        """The flow control of this kind (``KindLimit()``: none)."""
        return KindLimit(self.concurrency, self.limit_by, self.rate, self.fair_by)

    def declared(self) -> DeclaredKind:
        """What a worker declares of this kind in ``agora.kinds``."""
        return DeclaredKind(self.queue, self.max_retries, None if self.timeout is None else float(self.timeout),
                            None if self.retry_backoff is None else float(self.retry_backoff))

    def apply(self, spec: JobSpec) -> JobSpec:
        """``spec`` as this kind enqueues it: its payload checked against ``payload`` (as
        the JSON object it is stored as; ``InvalidJob`` naming the field otherwise), and
        the kind's queue and max_retries where the spec gives none."""
        changes: dict[str, Any] = {}
        if self.payload is not None:
            changes["payload"] = check_payload(spec.payload, self.payload)
        if spec.queue is None and self.queue is not None:
            changes["queue"] = self.queue
        if spec.max_retries is None and self.max_retries is not None:
            changes["max_retries"] = self.max_retries
        return dataclasses.replace(spec, **changes) if changes else spec


KindTable = Mapping[str, KindOptions]  # what a Queue, SyncQueue or the API applies at enqueue


def apply_kinds(kinds: KindTable, specs: list[JobSpec]) -> list[JobSpec]:
    """Each spec as a public producer (``Queue``, ``SyncQueue``, the API, the CLI) enqueues
    it: as its kind enqueues it (``KindOptions.apply``; unknown kinds as given), into a
    queue that is not one of agora-pg's own (``InvalidJob`` otherwise)."""
    if kinds:
        specs = [options.apply(spec) if (options := kinds.get(spec.kind)) is not None else spec for spec in specs]
    for spec in specs:
        refuse_reserved_queue(spec)
    return specs


def kind_table(source: Any) -> dict[str, KindOptions]:
    """The kind options of a ``Handlers`` table, a ``Worker`` or a ``WorkerPool`` (its job
    worker's); empty for a plain dict of handlers or None."""
    if source is None:
        return {}
    if isinstance(source, Handlers):
        return source.all_options()
    kind_options = getattr(source, "kind_options", None)
    if kind_options is None and getattr(source, "job_worker", None) is not None:
        kind_options = source.job_worker.kind_options
    return dict(kind_options or {})


class Handlers(Mapping[str, Handler]):
    """The handler table with per-kind options; a ``Worker`` takes it where it takes a dict.

    >>> handlers = Handlers()
    >>> @handlers.kind("send_email", timeout=30, non_retryable=(ValueError,))
    ... async def send_email(job, resources): ...
    """

    def __init__(self, handlers: Mapping[str, Handler] | None = None) -> None:
        self._handlers: dict[str, Handler] = dict(handlers or {})
        self._options: dict[str, KindOptions] = {}
        self._queue_limits: dict[str, QueueLimit] = {}

    def kind(
        self, name: str, *, timeout: float | None = None, non_retryable: tuple[type[BaseException], ...] = (),
        max_retries: int | None = None, retry_backoff: float | None = None, queue: str | None = None,
        payload: type | None = None, concurrency: int | None = None, limit_by: str | None = None,
        rate: tuple[int, float] | None = None, fair_by: str | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of ``name`` (options: ``KindOptions``)."""

        def register(handler: Handler) -> Handler:
            self.add(name, handler, timeout=timeout, non_retryable=non_retryable, max_retries=max_retries,
                     retry_backoff=retry_backoff, queue=queue, payload=payload, concurrency=concurrency,
                     limit_by=limit_by, rate=rate, fair_by=fair_by)
            return handler

        return register

    def add(
        self, name: str, handler: Handler, *, timeout: float | None = None,
        non_retryable: tuple[type[BaseException], ...] = (), max_retries: int | None = None,
        retry_backoff: float | None = None, queue: str | None = None, payload: type | None = None,
        concurrency: int | None = None, limit_by: str | None = None, rate: tuple[int, float] | None = None,
        fair_by: str | None = None,
    ) -> None:
        """Register ``handler`` for ``name`` (as ``kind`` does, without decorating)."""
        with _about("kind", name):
            JobSpec(name)  # (a kind's rules are a public job's)
            options = KindOptions(timeout, tuple(non_retryable), max_retries, retry_backoff, queue, payload,
                                  concurrency, limit_by, rate, fair_by)
        if not callable(handler):
            raise TypeError(f"the handler of {name!r} must be callable, got {type(handler).__name__}")
        if name in self._handlers:
            raise ValueError(f"kind {name!r} is registered twice")
        self._handlers[name] = handler
        self._options[name] = options

    def queue(self, name: str, *, concurrency: int | None = None, rate: tuple[int, float] | None = None) -> None:
        """Limit queue ``name``, across every worker and of every kind together: at most
        ``concurrency`` of its jobs running at once, at most ``rate`` = ``(n, seconds)`` of
        them starting in any ``seconds`` (the database's clock). Neither: its limits are
        removed. A worker with this table declares them when it starts; an agora/v1
        config's ``[queues.NAME]`` wins over it."""
        with _about("queue", name):
            refuse_reserved_queue(JobSpec("kind", queue=name))  # (a queue's rules are a public job's)
            self._queue_limits[name] = QueueLimit(concurrency, rate)

    def queue_limits(self) -> dict[str, QueueLimit]:
        """The queues' limits declared with ``queue`` (``QueueLimit()``: to be removed)."""
        return dict(self._queue_limits)

    def options(self, kind: str) -> KindOptions:
        return self._options.get(kind, KindOptions())

    def all_options(self) -> dict[str, KindOptions]:
        """Every registered kind's options (what a ``Queue`` given this table applies)."""
        return dict(self._options)

    def __getitem__(self, kind: str) -> Handler:
        return self._handlers[kind]

    def __iter__(self) -> Iterator[str]:
        return iter(self._handlers)

    def __len__(self) -> int:
        return len(self._handlers)


def is_async_handler(handler: Handler) -> bool:
    if inspect.iscoroutinefunction(handler):
        return True
    call = getattr(handler, "__call__", None)  # noqa: B004 - objects with async __call__
    return call is not None and inspect.iscoroutinefunction(call)


def handler_name(handler: Handler) -> str:
    """``module.function`` for log lines."""
    module = getattr(handler, "__module__", None) or "?"
    name = getattr(handler, "__qualname__", None) or type(handler).__name__
    return f"{module}.{name}"


@contextlib.contextmanager
def _about(what: str, name: object) -> Iterator[None]:
    """A job's rule (``InvalidJob``) or a limit's bound (``InvalidLimit``) broken in the
    block, as an error naming the kind or queue (its repr cut short past 80 characters)."""
    shown = repr(name[:60] + "…") if isinstance(name, str) and len(name) > 80 else repr(name)
    try:
        yield
    except InvalidJob as error:
        raise InvalidJob(error.field, f"{error.problem} ({what} {shown})") from None
    except InvalidLimit as error:
        raise InvalidLimit(error.field, f"{error.reason} ({what} {shown})") from None
