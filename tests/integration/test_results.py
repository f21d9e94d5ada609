"""Results: what a handler returns is stored on its attempt's run, shown by GET /jobs/{id}
and returned by ``Queue.wait``; jobs that end without one make ``wait`` raise."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
from datetime import UTC, datetime
from typing import Any

import pytest

from agora_pg import Fail, Job, JobFailed, JobStatus, Queue, Settings, Worker
from agora_pg.api import create_app
from agora_pg.db.store import Store
from agora_pg.errors import JobNotFound

from .helpers import running

from litestar.testing import AsyncTestClient


async def add(job: Job, resources: Any) -> dict[str, Any]:
    return {"sum": job.payload["a"] + job.payload["b"]}


def words(job: Job, resources: Any) -> list[str]:  # a sync handler, run in a thread
    return str(job.payload["text"]).split()


async def nothing(job: Job, resources: Any) -> None:
    return None


async def not_json(job: Job, resources: Any) -> object:
    return object()  # JSON cannot hold it


@dataclasses.dataclass
class Receipt:
    sent_to: str
    at: datetime


async def typed(job: Job, resources: Any) -> Receipt:
    return Receipt("ada@example.com", datetime(2026, 12, 6, 9, 30, tzinfo=UTC))


async def nul_text(job: Job, resources: Any) -> str:
    return "a\x00b"  # jsonb cannot hold a NUL


async def refuse(job: Job, resources: Any) -> None:
    raise Fail("no such account")


async def long(job: Job, resources: Any) -> None:
    await asyncio.sleep(60)


FLAKY_CALLS: dict[int, int] = {}


async def flaky(job: Job, resources: Any) -> str:
    FLAKY_CALLS[job.id] = FLAKY_CALLS.get(job.id, 0) + 1
    if FLAKY_CALLS[job.id] == 1:
        raise RuntimeError("first attempt fails")
    return "second time lucky"


HANDLERS = {"add": add, "words": words, "nothing": nothing, "not_json": not_json, "nul_text": nul_text,
            "typed": typed, "refuse": refuse, "long": long, "flaky": flaky}


async def test_a_returned_value_is_the_result_wait_returns_and_get_job_shows(
    queue: Queue, store: Store, settings: Settings
) -> None:
    summed = await queue.enqueue("add", {"a": 1, "b": 2})
    split = await queue.enqueue("words", {"text": "to be or not"})
    empty = await queue.enqueue("nothing")
    async with running(Worker(HANDLERS, settings=settings)):
        assert await queue.wait(summed.id, timeout=10) == {"sum": 3}
        assert await queue.wait(split.id, timeout=10) == ["to", "be", "or", "not"]
        assert await queue.wait(empty.id, timeout=10) is None
    [run] = await store.runs.of_job(summed.id)
    assert (run.status, run.result) == ("succeeded", {"sum": 3})
    assert await queue.wait(summed.id, timeout=1) == {"sum": 3}  # a finished job answers at once
    async with AsyncTestClient(app=create_app(settings), base_url="http://api.localhost:8000") as client:
        body = (await client.get(f"/jobs/{summed.id}")).json()
    assert body["result"] == {"sum": 3} and body["runs"][0]["result"] == {"sum": 3}


async def test_a_dataclass_result_is_stored_as_an_object(
    queue: Queue, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agora_pg")
    job = await queue.enqueue("typed")
    async with running(Worker(HANDLERS, settings=settings)):
        assert await queue.wait(job.id, timeout=10) == {"sent_to": "ada@example.com", "at": "2026-12-06T09:30:00Z"}
    assert "not stored" not in caplog.text


async def test_a_result_json_cannot_hold_is_not_stored_and_the_job_still_succeeds(
    queue: Queue, store: Store, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agora_pg")
    odd = await queue.enqueue("not_json")
    nul = await queue.enqueue("nul_text")
    async with running(Worker(HANDLERS, settings=settings)):
        assert await queue.wait(odd.id, timeout=10) is None
        assert await queue.wait(nul.id, timeout=10) is None
    assert (await queue.get(odd.id)).status is JobStatus.DONE
    assert "the handler's result (object) is not stored" in caplog.text
    assert "the handler's result is not stored: it holds a NUL character" in caplog.text


@pytest.mark.connections(16)
async def test_wait_raises_for_a_failed_or_cancelled_job_and_returns_the_result_after_a_retry(
    queue: Queue, settings: Settings
) -> None:
    refused = await queue.enqueue("refuse")
    cancelled = await queue.enqueue("long")
    retried = await queue.enqueue("flaky", max_retries=2)
    async with running(Worker(HANDLERS, settings=settings)):
        with pytest.raises(JobFailed, match=f"job {refused.id} failed: Fail: no such account") as failed:
            await queue.wait(refused.id, timeout=10)
        assert failed.value.status == "failed"
        waiter = asyncio.create_task(queue.wait(cancelled.id, timeout=10))
        await asyncio.sleep(0.5)
        await queue.cancel(cancelled.id)
        with pytest.raises(JobFailed) as stopped:
            await waiter
        assert stopped.value.status == "cancelled"
        assert await queue.wait(retried.id, timeout=10) == "second time lucky"


async def test_wait_times_out_leaving_the_job_alone_and_an_unknown_job_is_not_found(queue: Queue) -> None:
    job = await queue.enqueue("add", {"a": 1, "b": 1})  # no worker runs
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await queue.wait(job.id, timeout=0.5)
    assert time.monotonic() - started >= 0.45  # it waited its timeout (a lower bound: load only adds to it)
    assert (await queue.get(job.id)).status is JobStatus.PENDING
    with pytest.raises(JobNotFound):
        await queue.wait(10**12, timeout=1)
