"""Concrete stages: each is small and tested on its own."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from zoneinfo import ZoneInfo

from families.appointment_reminder.ports import Appointment, Message, Receipt

log = logging.getLogger("worker.appointment_reminder")


class AppointmentNotFound(LookupError):
    pass


class LoadFromBook:
    """Load an appointment from the book the worker's resources hold."""

    def __init__(self, book: Mapping[int, Appointment]) -> None:
        self.book = book

    async def load(self, appointment_id: int) -> Appointment:
        if not isinstance(appointment_id, int) or isinstance(appointment_id, bool):
            raise TypeError(f"appointment_id must be a whole number, got {appointment_id!r}")
        try:
            return self.book[appointment_id]
        except KeyError:
            raise AppointmentNotFound(f"no appointment {appointment_id}") from None


class ComposeReminder:
    """The reminder's text, with the time in the clinic's own time zone."""

    def __init__(self, template: str) -> None:
        self.template = template

    def compose(self, appointment: Appointment) -> Message:
        local = appointment.starts_at.astimezone(ZoneInfo(appointment.timezone))
        text = self.template.format(name=appointment.patient_name, clinic=appointment.clinic,
                                    day=local.strftime("%A %d %B"), time=local.strftime("%H:%M"))
        return Message(to=appointment.contact, text=text)


class DeliverToOutbox:
    """Deliver by appending to an outbox (a list the worker's resources hold) and logging."""

    def __init__(self, outbox: list[Message], channel: str) -> None:
        self.outbox = outbox
        self.channel = channel

    async def deliver(self, appointment: Appointment, message: Message) -> Receipt:
        self.outbox.append(message)
        log.info("reminder for appointment %d sent by %s to %s: %s", appointment.id, self.channel, message.to,
                 message.text)
        return Receipt(appointment.id, self.channel, message.to)
