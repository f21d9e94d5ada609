"""Handlers by kind, and the options a kind is registered with."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

from agora_pg.errors import AgoraError
from agora_pg.jobs import Job

Handler = Callable[[Job, Any], Awaitable[Any] | Any]


class UnknownJobKind(AgoraError):
    """No handler is registered for a job's kind; the attempt fails."""

    def __init__(self, kind: str, known: list[str]) -> None:
        listed = ", ".join(sorted(known)) or "none"
        super().__init__(f"no handler registered for kind {kind!r} (this worker handles: {listed})")
        self.kind = kind


@dataclasses.dataclass(frozen=True)
class KindOptions:
    """Options of one kind. ``timeout``: seconds an attempt may run (a job's own
    ``timeout_seconds`` wins; None takes ``WORKER_JOB_TIMEOUT``). ``non_retryable``:
    exception types that fail the job at once, like ``agora_pg.Fail``."""

    timeout: float | None = None
    non_retryable: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if self.timeout is not None and not (isinstance(self.timeout, int | float) and self.timeout > 0):
            raise ValueError(f"timeout must be a number of seconds > 0, got {self.timeout!r}")
        for error_type in self.non_retryable:
            if not (isinstance(error_type, type) and issubclass(error_type, BaseException)):
                raise TypeError(f"non_retryable takes exception types, got {error_type!r}")


class Handlers(Mapping[str, Handler]):
    """The handler table with per-kind options; a ``Worker`` takes it where it takes a dict.

    >>> handlers = Handlers()
    >>> @handlers.kind("send_email", timeout=30, non_retryable=(ValueError,))
    ... async def send_email(job, resources): ...
    """

    def __init__(self, handlers: Mapping[str, Handler] | None = None) -> None:
        self._handlers: dict[str, Handler] = dict(handlers or {})
        self._options: dict[str, KindOptions] = {}

    def kind(
        self, name: str, *, timeout: float | None = None, non_retryable: tuple[type[BaseException], ...] = ()
    ) -> Callable[[Handler], Handler]:
        """Register the decorated function as the handler of ``name``."""

        def register(handler: Handler) -> Handler:
            self.add(name, handler, timeout=timeout, non_retryable=non_retryable)
            return handler

        return register

    def add(
        self, name: str, handler: Handler, *, timeout: float | None = None,
        non_retryable: tuple[type[BaseException], ...] = (),
    ) -> None:
        """Register ``handler`` for ``name`` (as ``kind`` does, without decorating)."""
        if not isinstance(name, str) or not name.strip():
            raise ValueError("a kind must be a non-empty string")
        if not callable(handler):
            raise TypeError(f"the handler of {name!r} must be callable, got {type(handler).__name__}")
        if name in self._handlers:
            raise ValueError(f"kind {name!r} is registered twice")
        self._handlers[name] = handler
        self._options[name] = KindOptions(timeout, tuple(non_retryable))

    def options(self, kind: str) -> KindOptions:
        return self._options.get(kind, KindOptions())

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
