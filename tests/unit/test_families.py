"""Job families: the registry, and the appointment_reminder stages one by one, then wired."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest

from agora_pg.families import FamilyRegistry, UnknownVariant
from agora_pg.jobs import Job, JobStatus
from families.appointment_reminder import AppointmentReminder, register_appointment_reminder
from families.appointment_reminder.ports import Appointment, Message
from families.appointment_reminder.stages import AppointmentNotFound, ComposeReminder, DeliverToOutbox, LoadFromBook

WHEN = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)  # 09:30 in London (winter), 10:30 in Berlin
ADA = Appointment(1, "Ada", "ada@example.com", WHEN, "Marylebone Clinic", "Europe/London")


def job(kind: str, payload: dict[str, Any]) -> Job:
    return Job(id=1, name=kind, kind=kind, queue="default", status=JobStatus.PROCESSING, payload=payload, priority=0,
               run_at=WHEN, retry_count=0, max_retries=3, error_message=None, dedup_key=None, created_at=WHEN,
               started_at=WHEN, finished_at=None, locked_by="w", lease_expires_at=None, attempt=1)


@dataclasses.dataclass
class Resources:
    appointments: dict[int, Appointment]
    outbox: list[Message]


async def test_load_finds_the_appointment_or_says_which_is_missing() -> None:
    stage = LoadFromBook({1: ADA})
    assert await stage.load(1) == ADA
    with pytest.raises(AppointmentNotFound, match="no appointment 7"):
        await stage.load(7)
    with pytest.raises(TypeError, match="whole number"):
        await stage.load("1")  # type: ignore[arg-type]


def test_compose_uses_the_clinic_time_zone() -> None:
    compose = ComposeReminder("{name} at {clinic}, {day} {time}")
    assert compose.compose(ADA) == Message("ada@example.com", "Ada at Marylebone Clinic, Tuesday 01 December 09:30")
    in_berlin = dataclasses.replace(ADA, clinic="Charité", timezone="Europe/Berlin")
    assert compose.compose(in_berlin).text == "Ada at Charité, Tuesday 01 December 10:30"
    summer = dataclasses.replace(ADA, starts_at=datetime(2026, 7, 1, 8, 30, tzinfo=UTC))
    assert compose.compose(summer).text.endswith("Wednesday 01 July 09:30")  # British Summer Time


async def test_deliver_appends_to_the_outbox() -> None:
    outbox: list[Message] = []
    receipt = await DeliverToOutbox(outbox, "sms").deliver(ADA, Message("x", "hi"))
    assert (receipt.appointment_id, receipt.channel, outbox) == (1, "sms", [Message("x", "hi")])


async def test_the_wired_root_runs_load_compose_deliver() -> None:
    outbox: list[Message] = []
    root = AppointmentReminder(LoadFromBook({1: ADA}), ComposeReminder("{name}"), DeliverToOutbox(outbox, "email"))
    receipt = await root.run({"appointment_id": 1})
    assert (receipt.to, outbox) == ("ada@example.com", [Message("ada@example.com", "Ada")])


async def test_registry_dispatches_on_the_variant() -> None:
    resources = Resources({1: ADA}, [])
    handlers = register_appointment_reminder(FamilyRegistry()).handlers()
    email = await handlers["appointment_reminder"](job("appointment_reminder", {"appointment_id": 1}), resources)
    sms = await handlers["appointment_reminder"](
        job("appointment_reminder", {"appointment_id": 1, "variant": "sms"}), resources)
    assert (email.channel, sms.channel) == ("email", "sms")
    assert resources.outbox[0].text.startswith("Dear Ada") and resources.outbox[1].text.startswith("Marylebone Clinic:")
    with pytest.raises(UnknownVariant, match="has no variant 'fax'"):
        await handlers["appointment_reminder"](job("appointment_reminder", {"appointment_id": 1, "variant": "fax"}),
                                               resources)


async def test_registry_takes_plain_handlers_and_refuses_duplicates() -> None:
    registry = FamilyRegistry().register("report", "default", lambda job, resources: f"report {job.payload['n']}")
    assert await registry.handlers()["report"](job("report", {"n": 3}), None) == "report 3"
    with pytest.raises(ValueError, match="registered already"):
        registry.register("report", "default", lambda job, resources: None)
    with pytest.raises(TypeError):
        registry.register("report", "other", "not callable")
