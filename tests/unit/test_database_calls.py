"""``unless_stopped``: a call abandoned when its stop event is set, with a StopSignal
(the task is cancelled directly) or a plain Event (raced in tasks). No database."""

from __future__ import annotations

import asyncio

import pytest

from agora_pg.errors import ConnectionLost, DatabaseUnavailable
from agora_pg.runtime.database_calls import StopSignal, Stopped, retry_database, unless_stopped


@pytest.fixture(params=["signal", "event"])
def make_stop(request: pytest.FixtureRequest) -> type[asyncio.Event]:
    return StopSignal if request.param == "signal" else asyncio.Event


async def answer(value: int, after: float = 0.0) -> int:
    await asyncio.sleep(after)
    return value


def test_a_call_that_ends_first_returns_its_result(make_stop: type[asyncio.Event]) -> None:
    async def main() -> int:
        return await unless_stopped(answer(7, 0.01), make_stop())

    assert asyncio.run(main()) == 7


def test_setting_the_stop_abandons_the_call_in_flight(make_stop: type[asyncio.Event]) -> None:
    cleaned_up = []

    async def slow() -> int:
        try:
            await asyncio.sleep(30)
        finally:
            cleaned_up.append(True)
        return 1

    async def main() -> None:
        stop = make_stop()
        asyncio.get_running_loop().call_later(0.05, stop.set)
        with pytest.raises(Stopped):
            await asyncio.wait_for(unless_stopped(slow(), stop), 5)
        # the task that awaited is not left cancelled: it goes on normally
        assert await answer(3, 0.01) == 3

    asyncio.run(main())
    assert cleaned_up == [True]


def test_a_stop_set_before_the_call_never_starts_it(make_stop: type[asyncio.Event]) -> None:
    started = []

    async def call() -> None:
        started.append(True)

    async def main() -> None:
        stop = make_stop()
        stop.set()
        with pytest.raises(Stopped):
            await unless_stopped(call(), stop)

    asyncio.run(main())
    assert started == []


def test_a_cancel_from_elsewhere_is_a_cancel_not_a_stop(make_stop: type[asyncio.Event]) -> None:
    async def main() -> None:
        stop = make_stop()
        task = asyncio.create_task(unless_stopped(answer(1, 30), stop))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not stop.is_set()

    asyncio.run(main())


def test_a_cancel_from_elsewhere_together_with_the_stop_stays_a_cancel() -> None:
    async def main() -> None:
        stop = StopSignal()
        task = asyncio.create_task(unless_stopped(answer(1, 30), stop))
        await asyncio.sleep(0.02)
        stop.set()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())


def test_one_signal_interrupts_every_call_waiting_on_it() -> None:
    async def main() -> list[object]:
        stop = StopSignal()
        tasks = [asyncio.create_task(unless_stopped(answer(i, 30), stop)) for i in range(3)]
        await asyncio.sleep(0.02)
        stop.set()
        return await asyncio.gather(*tasks, return_exceptions=True)

    assert all(isinstance(result, Stopped) for result in asyncio.run(main()))


def test_retries_ended_by_the_stop_end_in_stopped_whatever_the_last_error(make_stop: type[asyncio.Event]) -> None:
    """A caller stopped while a lost connection is retried sees ``Stopped`` (caused by
    the lost connection), never the lost connection itself: a worker stopped while its
    registration waits for the database stops cleanly."""
    calls = 0

    async def main() -> None:
        stop = make_stop()

        async def lost_while_stopping() -> None:
            nonlocal calls
            calls += 1
            stop.set()  # the stop arrives while the call fails
            raise ConnectionLost("the connection broke")

        await retry_database(lost_while_stopping, what="registering", stop=stop, first_wait=0.01)

    with pytest.raises(Stopped) as raised:
        asyncio.run(main())
    assert isinstance(raised.value.__cause__, ConnectionLost)
    assert calls == 1


def test_retries_waiting_when_the_stop_comes_end_in_stopped(make_stop: type[asyncio.Event]) -> None:
    async def main() -> None:
        stop = make_stop()

        async def unavailable() -> None:
            asyncio.get_running_loop().call_later(0.05, stop.set)
            raise DatabaseUnavailable("no server")

        await retry_database(unavailable, what="registering", stop=stop, first_wait=5)

    with pytest.raises(Stopped, match=r"registering: no server"):
        asyncio.run(main())
