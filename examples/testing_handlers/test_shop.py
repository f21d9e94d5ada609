"""Tests a user writes with agora-pg's pytest plugin: no conftest, only its fixtures."""

from __future__ import annotations

from agora_pg import JobStatus, Queue, Settings, SyncQueue, Worker
from agora_pg.testing import run_until_idle

from shop import handlers


async def test_add_returns_the_sum(agora_queue: Queue, agora_settings: Settings) -> None:
    job = await agora_queue.enqueue("add", {"a": 2, "b": 3})
    [ran] = await run_until_idle(Worker(handlers, settings=agora_settings))
    assert ran.job.id == job.id and ran.job.status is JobStatus.DONE
    assert ran.result == {"sum": 5}


async def test_a_refused_charge_fails_at_once(agora_queue: Queue, agora_settings: Settings) -> None:
    await agora_queue.enqueue("charge", {"amount": 0}, max_retries=5)
    await agora_queue.enqueue("charge", {"amount": 12})
    refused, charged = await run_until_idle(Worker(handlers, settings=agora_settings))
    assert refused.job.status is JobStatus.FAILED and refused.job.retry_count == 1
    assert refused.job.error_message == "Fail: amount must be positive"
    assert (charged.job.status, charged.result) == (JobStatus.DONE, "charged 12")


async def test_jobs_enqueued_by_handlers_run_too(agora_queue: Queue, agora_settings: Settings) -> None:
    await agora_queue.enqueue("fan_out", {"pairs": [[1, 1], [2, 2], [3, 3]]})
    ran = await run_until_idle(Worker(handlers, resources=agora_queue, settings=agora_settings))
    assert sorted(r.result["sum"] for r in ran if r.job.kind == "add") == [2, 4, 6]
    assert [r.result for r in ran if r.job.kind == "fan_out"] == [3]


def test_each_test_has_a_database_of_its_own(agora_database_url: str) -> None:
    with SyncQueue.connect(agora_database_url) as queue:  # from synchronous code too
        assert queue.enqueue("add", {"a": 1, "b": 1}).id == 1  # a fresh clone: ids start again
