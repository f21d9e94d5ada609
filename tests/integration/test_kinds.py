"""Per-kind options from the Handlers table: typed payloads checked at enqueue (Python and
HTTP) and decoded for the handler, and the kind's queue, max_retries and retry backoff."""

from __future__ import annotations

import dataclasses
import logging
from datetime import datetime
from typing import Any

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from agora_pg import Handlers, InvalidJob, Job, JobSpec, JobStatus, Queue, Settings, SyncQueue, Worker
from agora_pg.api import create_app
from agora_pg.db.store import Store
from agora_pg.testing import run_until_idle

from .helpers import running, wait_until


@dataclasses.dataclass
class Email:
    to: str
    cc: list[str] = dataclasses.field(default_factory=list)


class Line(msgspec.Struct):
    sku: str
    quantity: int = 1


class Order(msgspec.Struct):
    lines: list[Line]
    deliver_by: datetime | None = None


SEEN: list[Any] = []
handlers = Handlers()


@handlers.kind("send_email", payload=Email, queue="mail", max_retries=5)
async def send_email(job: Job, resources: Any) -> str:
    SEEN.append(job.payload)
    return f"sent to {job.payload.to}"


@handlers.kind("ship", payload=Order)
def ship(job: Job, resources: Any) -> int:  # sync handler: decoded too
    SEEN.append(job.payload)
    return sum(line.quantity for line in job.payload.lines)


@handlers.kind("flaky", retry_backoff=100)
async def flaky(job: Job, resources: Any) -> None:
    raise RuntimeError("try later")


async def test_typed_payloads_are_checked_at_enqueue_and_decoded_for_the_handler(
    store: Store, settings: Settings
) -> None:
    SEEN.clear()
    async with Queue.connect(settings=settings, handlers=handlers) as queue:
        mail = await queue.enqueue("send_email", Email(to="a@b.c"))
        assert (mail.payload, mail.queue, mail.max_retries) == ({"to": "a@b.c", "cc": []}, "mail", 5)
        other = await queue.enqueue("send_email", {"to": "x@y.z", "cc": ["q@r.s"]}, queue="urgent", max_retries=1)
        assert (other.queue, other.max_retries) == ("urgent", 1)  # the caller's choice wins
        order = await queue.enqueue_many([JobSpec("ship", {"lines": [{"sku": "A", "quantity": 2}, {"sku": "B"}],
                                                           "deliver_by": "2030-01-01T10:00:00+00:00"})])
        with pytest.raises(InvalidJob, match=r"^payload\.to: Expected `str`, got `int`") as bad:
            await queue.enqueue("send_email", {"to": 42})
        assert bad.value.field == "payload.to"
        with pytest.raises(InvalidJob, match=r"^payload\.lines\[1\]\.sku: Object missing required field"):
            await queue.enqueue_many([JobSpec("ship", {"lines": [{"sku": "A"}]}),
                                      JobSpec("ship", {"lines": [{"sku": "A"}, {"quantity": 1}]})])
        assert [spec.queue for spec in [JobSpec("ship")]] == [None]
    async with store.connection() as connection:
        assert await connection.fetchval("SELECT count(*) FROM agora.jobs") == 3  # nothing of the bad batch
    worker = Worker(handlers, settings=settings.replace(queues=("default", "mail", "urgent")))
    ran = {r.job.id: r for r in await run_until_idle(worker)}
    assert ran[mail.id].result == "sent to a@b.c" and ran[order[0].id].result == 3
    emails = [value for value in SEEN if isinstance(value, Email)]
    assert sorted(email.to for email in emails) == ["a@b.c", "x@y.z"]
    [shipped] = [value for value in SEEN if isinstance(value, Order)]
    assert shipped.lines == [Line("A", 2), Line("B", 1)] and shipped.deliver_by == datetime.fromisoformat(
        "2030-01-01T10:00:00+00:00")


async def test_a_stored_payload_that_does_not_decode_fails_at_once(store: Store, settings: Settings) -> None:
    async with store.connection() as connection:  # as a plain SQL insert would
        job_id = await connection.fetchval(
            "INSERT INTO agora.jobs (name, kind, queue, payload, max_retries) "
            "VALUES ('n', 'send_email', 'mail', '{\"to\": [1]}', 5) RETURNING id")
    [ran] = await run_until_idle(Worker(handlers, settings=settings.replace(queues=("mail",))))
    assert ran.job.id == job_id and ran.job.status is JobStatus.FAILED and ran.job.retry_count == 1
    assert ran.job.error_message is not None
    assert ran.job.error_message.startswith("Fail: the payload does not decode: payload.to: Expected `str`")


async def test_a_kinds_retry_backoff_replaces_the_workers(queue: Queue, store: Store, settings: Settings) -> None:
    job = await queue.enqueue("flaky", max_retries=3)
    async with running(Worker(handlers, settings=settings)):  # the settings' own backoff is 0
        await wait_until(lambda: _retry_count_is(store, job.id, 1))
    after = await queue.get(job.id)
    assert after.finished_at is not None
    delay = (after.run_at - after.finished_at).total_seconds()
    assert 49 <= delay <= 101, delay  # 100 s with equal jitter: between 50 and 100


async def _retry_count_is(store: Store, job_id: int, count: int) -> bool:
    return (await store.jobs.get(job_id)).retry_count == count


async def test_the_api_checks_a_typed_kind_and_documents_it(settings: Settings) -> None:
    async with AsyncTestClient(app=create_app(settings, handlers=handlers), base_url="http://api.localhost:8000") as client:
        bad = await client.post("/jobs", json={"kind": "send_email", "payload": {"cc": ["a"]}})
        assert bad.status_code == 400 and bad.json()["field"] == "payload.to", bad.text
        good = await client.post("/jobs", json={"kind": "send_email", "payload": {"to": "a@b.c"}})
        assert good.status_code == 201 and (good.json()["queue"], good.json()["max_retries"]) == ("mail", 5)
        plain = await client.post("/jobs", json={"kind": "unknown_kind", "payload": {"any": 1}})
        assert plain.status_code == 201 and plain.json()["queue"] == "default"
        document = (await client.get("/schema/openapi.json")).json()
    job_create = document["components"]["schemas"]["JobCreate"]
    conditions = {rule["if"]["properties"]["kind"]["const"]: rule["then"]["properties"]["payload"]
                  for rule in job_create["allOf"]}
    assert conditions == {"send_email": {"$ref": "#/components/schemas/Email"},
                          "ship": {"$ref": "#/components/schemas/Order"}}
    assert document["components"]["schemas"]["Email"]["required"] == ["to"]
    assert "Kinds with a declared payload type: send_email (Email), ship (Order)" in job_create["description"]


def test_the_sync_queue_applies_the_kinds_too(database_url: str, settings: Settings) -> None:
    with SyncQueue.connect(database_url, settings, handlers=handlers) as queue:
        job = queue.enqueue("send_email", Email(to="s@y.nc", cc=["c@c.c"]))
        assert (job.queue, job.payload) == ("mail", {"to": "s@y.nc", "cc": ["c@c.c"]})
        with pytest.raises(InvalidJob, match=r"^payload\.to"):
            queue.enqueue("send_email", {})


async def test_a_worker_warns_of_a_kinds_queue_it_does_not_claim(
    queue: Queue, settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="agora_pg")
    await queue.enqueue("flaky")  # work for the worker, so that it starts
    await run_until_idle(Worker(handlers, settings=settings))  # queues: default only
    assert "kind 'send_email' enqueues into queue 'mail', which this worker does not claim" in caplog.text


def test_kind_options_are_checked_when_registered() -> None:
    table = Handlers()
    with pytest.raises(TypeError, match="payload must be a dataclass or a msgspec.Struct class"):
        table.add("a", send_email, payload=dict)
    with pytest.raises(InvalidJob, match="queue"):
        table.add("b", send_email, queue=" padded")
    with pytest.raises(ValueError, match="max_retries must be a whole number >= 0"):
        table.add("c", send_email, max_retries=-1)
    with pytest.raises(ValueError, match="retry_backoff must be a number of seconds >= 0"):
        table.add("d", send_email, retry_backoff=-2)
    assert len(table) == 0


async def test_with_nothing_due_run_until_idle_returns_nothing(settings: Settings) -> None:
    # the worker is stopped while it registers: it ends without an error
    assert await run_until_idle(Worker(handlers, settings=settings)) == []
