"""The appointment_reminder family's stages, its wired root and its registration.

    pipeline = get_appointment_reminder_pipeline(appointment_svc)
    reminder = await pipeline.run(appointment_id)
"""

from __future__ import annotations

import logging
from typing import Any
from zoneinfo import ZoneInfo

from agora_pg import Fail
from agora_pg.families import Patterns
from families.appointment_reminder.abc import (
    Appointment,
    AppointmentReminderPipeline,
    AppointmentService,
    ComposePort,
    DeliverPort,
    LoadPort,
    Message,
    Reminder,
)
from families.shared import loader
from families.shared.ports import Outbox
from families.shared.registry import register

log = logging.getLogger("families.appointment_reminder")
KIND = "appointment_reminder"


class LoadFromService(LoadPort):
    def __init__(self, appointment_svc: AppointmentService) -> None:
        self.appointment_svc = appointment_svc

    async def load(self, appointment_id: int) -> Appointment:
        if not isinstance(appointment_id, int) or isinstance(appointment_id, bool):
            raise Fail(f"appointment_id must be a whole number, got {appointment_id!r}")
        return await self.appointment_svc.get(appointment_id)


class ComposeFromPattern(ComposePort):
    """The variant's pattern (``reminder.email``, ``reminder.sms``), with the time in the
    clinic's own time zone."""

    def __init__(self, patterns: Patterns, variant: str) -> None:
        self.patterns = patterns
        self.pattern = f"reminder.{variant}"

    def compose(self, appointment: Appointment) -> Message:
        local = appointment.starts_at.astimezone(ZoneInfo(appointment.timezone))
        text = self.patterns.render(self.pattern, name=appointment.patient_name, clinic=appointment.clinic,
                                    day=local.strftime("%A %d %B"), time=local.strftime("%H:%M"))
        return Message(appointment.id, appointment.contact, text)


class DeliverByEmail(DeliverPort):
    channel = "email"

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox

    async def deliver(self, message: Message) -> Reminder:
        await self.outbox.send(self.channel, message.to, message.text)
        log.info("reminder for appointment %d sent by %s to %s: %s", message.appointment_id, self.channel,
                 message.to, message.text)
        return Reminder(message.appointment_id, self.channel, message.to, message.text)


class DeliverBySms(DeliverByEmail):
    channel = "sms"


class LogOutbox:
    """An outbox that only logs (what the family sends with no outbox given)."""

    async def send(self, channel: str, to: str, text: str) -> None:
        log.debug("outbox: %s to %s: %s", channel, to, text)


def get_appointment_reminder_pipeline(
    appointment_svc: AppointmentService, *, outbox: Outbox | None = None, variant: str | None = None,
) -> AppointmentReminderPipeline:
    """The family wired on ``appointment_svc`` (and ``outbox``), in ``variant`` (email by default)."""
    services = {"appointment_svc": appointment_svc, "outbox": outbox or LogOutbox()}
    pipeline: AppointmentReminderPipeline = loader.load(__package__, services, variant)
    return pipeline


class AppointmentReminder:
    """The root the worker runs for a job: the pipeline on the worker's services (the
    composition root's), run with the payload's ``appointment_id``."""

    variant = "email"

    def __init__(self, services: Any) -> None:
        self.pipeline = get_appointment_reminder_pipeline(services.appointment_svc, outbox=services.outbox,
                                                          variant=self.variant)

    async def run(self, payload: dict[str, Any]) -> Reminder:
        if "appointment_id" not in payload:
            raise Fail("an appointment_reminder job's payload needs appointment_id")
        return await self.pipeline.run(payload["appointment_id"])


class SmsAppointmentReminder(AppointmentReminder):
    variant = "sms"


for _root in (AppointmentReminder, SmsAppointmentReminder):
    register(KIND, _root.variant, _root, default=_root.variant == loader.default_variant(__package__))
