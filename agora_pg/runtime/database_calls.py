"""The one retry helper for database calls, and the LISTEN loop built on it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from agora_pg.db.store import Store
from agora_pg.errors import DatabaseUnavailable
from agora_pg.lifecycle import wait_for_event
from agora_pg.runtime.process import ErrorWait

log = logging.getLogger("agora_pg.runtime")

T = TypeVar("T")


async def retry_database(
    call: Callable[[], Awaitable[T]],
    *,
    what: str,
    stop: asyncio.Event | None = None,
    first_wait: float = 0.2,
) -> T:
    """``await call()`` until the database answers.

    ``DatabaseUnavailable`` (a lost connection, a call past its deadline, or a
    ``TransientDatabaseError`` such as a cancelled statement or a lock timeout) is
    retried with a doubling pause (at most 10 s), each logged as a WARNING saying
    ``what`` is waiting. Once ``stop`` is set the waiting ends with ``Stopped`` (caused
    by the last error; a call in flight then is abandoned), whatever the last error was.
    Any other error is raised at once: the caller records it as the failure it is.
    """
    pause = ErrorWait(first_wait)
    while True:
        try:
            return await call() if stop is None else await unless_stopped(call(), stop)
        except Stopped:
            raise
        except DatabaseUnavailable as error:
            if stop is not None and stop.is_set():
                raise Stopped(f"stopping ({what}: {error})") from error
            delay = pause.after(error, what, log)
            if stop is None:
                await asyncio.sleep(delay)
            elif await wait_for_event(stop, delay):
                raise Stopped(f"stopping ({what}: {error})") from error


class Stopped(DatabaseUnavailable):
    """A database call was abandoned, or its retries ended, because its caller is stopping."""


class StopSignal(asyncio.Event):
    """An ``asyncio.Event`` that, once set, also interrupts the calls awaited with
    ``unless_stopped(call, self)``: their tasks are cancelled directly, which costs a
    claim nothing (watching a plain Event takes two tasks and an ``asyncio.wait`` per
    call, a tenth of a worker's time at high claim rates)."""

    def __init__(self) -> None:
        super().__init__()
        self._guarded: set[asyncio.Task[Any]] = set()  # tasks awaiting a call under this signal
        self._interrupted: set[asyncio.Task[Any]] = set()  # those cancelled by set()

    def set(self) -> None:
        if self.is_set():
            return
        super().set()
        for task in self._guarded:
            self._interrupted.add(task)
            task.cancel()


async def unless_stopped(call: Awaitable[T], stop: asyncio.Event) -> T:
    """Await ``call`` unless ``stop`` is set first: then it is cancelled and ``Stopped``
    raised (its outcome is unknown: a statement may have committed without a reply)."""
    if stop.is_set():
        if asyncio.iscoroutine(call):
            call.close()
        raise Stopped("stopping")
    task = asyncio.current_task()
    if not isinstance(stop, StopSignal) or task is None:
        return await _unless_set(call, stop)
    stop._guarded.add(task)
    try:
        return await call
    except asyncio.CancelledError:
        if task in stop._interrupted and task.uncancel() == 0:
            raise Stopped("stopping") from None
        raise  # cancelled from elsewhere (too)
    finally:
        stop._guarded.discard(task)
        stop._interrupted.discard(task)


async def _unless_set(call: Awaitable[T], stop: asyncio.Event) -> T:
    """``unless_stopped`` for a plain Event: the call in a task of its own, raced with a waiter."""
    task = asyncio.ensure_future(call)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait((task, stopper), return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        stopper.cancel()
    if not task.done():
        task.cancel()
        raise Stopped("stopping")
    return task.result()


async def listen_until(
    store: Store,
    handlers: Mapping[str, Callable[[str], None]],
    stop: asyncio.Event,
    on_connected: Callable[[], None],
    what: str,
) -> None:
    """Keep a LISTEN connection for ``handlers`` (channel -> callback) until ``stop``.
    ``on_connected`` runs after every (re)connection: notifications sent while not
    listening are lost, so the caller looks at the tables once."""
    while not stop.is_set():
        try:
            listener = await retry_database(lambda: store.listen(handlers), what=what, stop=stop, first_wait=0.5)
        except Stopped:
            return
        on_connected()
        stopper = asyncio.create_task(stop.wait())
        watched: list[asyncio.Future[Any]] = [stopper, listener.closed]
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        stopper.cancel()
        await listener.close()
