"""The batcher behind RunBatches: which asks go out together, and when (no database)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping

from agora_pg.runner.run_batches import _Batcher


class Recorder:
    """A send function that records each batch and when it was sent."""

    def __init__(self) -> None:
        self.batches: list[tuple[float, list[str]]] = []

    async def send(self, asks: list[str]) -> Mapping[str, str]:
        self.batches.append((time.monotonic(), asks))
        await asyncio.sleep(0.01)
        return {ask: ask.upper() for ask in asks}


async def test_asks_due_later_go_out_together_at_that_moment() -> None:
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test")
    due = time.monotonic() + 0.1
    answers = await asyncio.gather(*(batcher.ask(key, key, not_before=due) for key in ("a", "b", "c")))
    assert answers == ["A", "B", "C"]
    assert [asks for _, asks in recorder.batches] == [["a", "b", "c"]]
    assert recorder.batches[0][0] >= due


async def test_an_ask_due_now_is_not_held_behind_one_due_later() -> None:
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test")
    later = asyncio.create_task(batcher.ask("later", "later", not_before=time.monotonic() + 0.5))
    await asyncio.sleep(0.02)
    asked = time.monotonic()
    assert await batcher.ask("now", "now") == "NOW"
    assert time.monotonic() - asked < 0.2
    assert await later == "LATER"
    assert [asks for _, asks in recorder.batches] == [["now"], ["later"]]


async def test_an_ask_due_sooner_is_not_held_behind_one_due_later() -> None:
    # A tick's own-share claims (due at the tick) asked while the sender waits for a
    # fallback claim's moment (half a second later): they go out at their own moment.
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test", gather_seconds=0.005)
    start = time.monotonic()
    fallback = asyncio.create_task(batcher.ask("fallback", "fallback", not_before=start + 0.5))
    await asyncio.sleep(0.02)  # the sender now waits for the fallback's moment
    own_due = start + 0.1
    assert await batcher.ask("own", "own", not_before=own_due) == "OWN"
    assert await fallback == "FALLBACK"
    assert [asks for _, asks in recorder.batches] == [["own"], ["fallback"]]
    (own_sent, _), (fallback_sent, _) = recorder.batches
    assert own_due <= own_sent < start + 0.5 <= fallback_sent


async def test_a_key_asked_twice_goes_out_in_two_statements() -> None:
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test", gather_seconds=0.005)
    await asyncio.gather(batcher.ask("k", "x"), batcher.ask("k", "y"), batcher.ask("j", "z"))
    assert [asks for _, asks in recorder.batches] == [["x", "z"], ["y"]]


async def test_a_cancelled_ask_not_yet_sent_is_withdrawn() -> None:
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test")
    due = time.monotonic() + 0.1
    withdrawn = asyncio.create_task(batcher.ask("gone", "gone", not_before=due))
    kept = asyncio.create_task(batcher.ask("kept", "kept", not_before=due))
    await asyncio.sleep(0.02)
    withdrawn.cancel()
    assert await kept == "KEPT"
    assert withdrawn.cancelled()
    assert [asks for _, asks in recorder.batches] == [["kept"]]


async def test_a_cancelled_ask_already_sent_still_goes_out() -> None:
    recorder = Recorder()
    batcher: _Batcher[str, str] = _Batcher(recorder.send, "test")
    sent = asyncio.create_task(batcher.ask("sent", "sent"))
    await asyncio.sleep(0.005)  # the statement is in flight (the send takes 10 ms)
    sent.cancel()
    await asyncio.sleep(0.02)
    assert sent.cancelled()
    assert [asks for _, asks in recorder.batches] == [["sent"]]
