"""The appointment_reminder family: each stage on its own, then the wired root against a
fake service, as the jobs document names them."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest

from agora_pg import Fail, Job, JobStatus
from agora_pg.families import MissingTemplateVariable, UnknownVariant, read_family
from families.appointment_reminder.abc import Appointment, Message, Reminder
from families.appointment_reminder.impl import (
    ComposeFromPattern,
    DeliverByEmail,
    DeliverBySms,
    LoadFromService,
    get_appointment_reminder_pipeline,
)
from families.shared.registry import FAMILIES
from init import AppointmentBook, AppointmentNotFound, MemoryOutbox, SentMessage, Services, init

WHEN = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)  # 09:30 in London (winter), 10:30 in Berlin
ADA = Appointment(1, "Ada", "ada@example.com", WHEN, "Marylebone Clinic", "Europe/London")
PATTERNS = read_family("families.appointment_reminder").patterns


class FakeAppointments:
    """The fake service: the appointments it was given, and which ids were asked for."""

    def __init__(self, *appointments: Appointment) -> None:
        self.appointments = {appointment.id: appointment for appointment in appointments}
        self.asked: list[int] = []

    async def get(self, appointment_id: int) -> Appointment:
        self.asked.append(appointment_id)
        return self.appointments[appointment_id]


async def test_the_seed_lines_run_as_written() -> None:
    appointment_svc = FakeAppointments(ADA)
    pipeline = get_appointment_reminder_pipeline(appointment_svc)
    reminder = await pipeline.run(1)
    assert reminder == Reminder(1, "email", "ada@example.com", "Dear Ada, this is a reminder of your appointment "
                                                              "at Marylebone Clinic on Tuesday 01 December at 09:30.")
    assert appointment_svc.asked == [1]


async def test_load_asks_the_service_and_refuses_a_bad_id() -> None:
    stage = LoadFromService(FakeAppointments(ADA))
    assert await stage.load(1) == ADA
    with pytest.raises(Fail, match="whole number"):
        await stage.load("1")  # type: ignore[arg-type]
    with pytest.raises(AppointmentNotFound, match="no appointment 7"):
        await LoadFromService(AppointmentBook({})).load(7)


def test_compose_uses_the_variant_pattern_and_the_clinic_time_zone() -> None:
    assert ComposeFromPattern(PATTERNS, "sms").compose(ADA) == Message(
        1, "ada@example.com", "Marylebone Clinic: appointment Tuesday 01 December 09:30. Reply C to cancel.")
    in_berlin = dataclasses.replace(ADA, clinic="Charité", timezone="Europe/Berlin")
    assert ComposeFromPattern(PATTERNS, "sms").compose(in_berlin).text.startswith("Charité: appointment Tuesday "
                                                                                  "01 December 10:30")
    summer = dataclasses.replace(ADA, starts_at=datetime(2026, 7, 1, 8, 30, tzinfo=UTC))
    assert "Wednesday 01 July at 09:30" in ComposeFromPattern(PATTERNS, "email").compose(summer).text  # BST


def test_a_blank_value_is_an_error_not_a_hole_in_the_message() -> None:
    nameless = dataclasses.replace(ADA, patient_name=" ")
    with pytest.raises(MissingTemplateVariable, match=r"pattern reminder.email \(.*reminder.yaml, line 3\) needs a "
                                                      r"value for name"):
        ComposeFromPattern(PATTERNS, "email").compose(nameless)


async def test_deliver_sends_through_the_outbox() -> None:
    outbox = MemoryOutbox()
    message = Message(1, "+44 1", "hi")
    assert await DeliverBySms(outbox).deliver(message) == Reminder(1, "sms", "+44 1", "hi")
    assert await DeliverByEmail(outbox).deliver(message) == Reminder(1, "email", "+44 1", "hi")
    assert outbox.sent == [SentMessage("sms", "+44 1", "hi"), SentMessage("email", "+44 1", "hi")]


async def test_the_wired_root_runs_load_compose_deliver_in_each_variant() -> None:
    outbox = MemoryOutbox()
    email = await get_appointment_reminder_pipeline(FakeAppointments(ADA), outbox=outbox).run(1)
    sms = await get_appointment_reminder_pipeline(FakeAppointments(ADA), outbox=outbox, variant="sms").run(1)
    assert (email.channel, sms.channel) == ("email", "sms")
    assert [sent.text for sent in outbox.sent] == [email.text, sms.text]
    assert sms.text.startswith("Marylebone Clinic: appointment")


def job(payload: dict[str, object]) -> Job:
    return Job(id=1, name="remind", kind="appointment_reminder", queue="default", status=JobStatus.PROCESSING,
               payload=payload, priority=0, run_at=WHEN, retry_count=0, max_retries=3, error_message=None,
               dedup_key=None, created_at=WHEN, started_at=WHEN, finished_at=None, locked_by="w",
               lease_expires_at=None, attempt=1)


async def test_the_worker_handler_runs_the_variant_the_payload_names_on_inits_services() -> None:
    services = init()
    handler = FAMILIES.handlers()["appointment_reminder"]
    email = await handler(job({"appointment_id": 1}), services)  # the runtime spec's default_variant
    sms = await handler(job({"appointment_id": 2, "variant": "sms"}), services)
    assert (email.channel, sms.channel) == ("email", "sms")
    assert isinstance(services.outbox, MemoryOutbox) and len(services.outbox.sent) == 2
    with pytest.raises(UnknownVariant, match="has no variant 'fax'"):
        await handler(job({"appointment_id": 1, "variant": "fax"}), services)
    with pytest.raises(Fail, match="needs appointment_id"):
        await handler(job({}), services)
    missing = Services("hi", AppointmentBook({}), MemoryOutbox())
    with pytest.raises(AppointmentNotFound) as raised:
        await handler(job({"appointment_id": 9}), missing)
    assert "in stage load (LoadFromService) of families.appointment_reminder" in raised.value.__notes__
