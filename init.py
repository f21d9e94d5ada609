"""The composition root: the services of this project, wired in one place.

``worker.py`` runs its handlers on ``init()``'s services (its lifespan), and so do the
families it registers; ``agora-pg api --module worker`` reads the same module. A new
dependency is added here, once.
"""

from __future__ import annotations

import dataclasses
import logging
from datetime import UTC, datetime, timedelta

from agora_pg import Fail
from families.appointment_reminder.abc import Appointment
from families.shared.ports import Outbox

log = logging.getLogger("init")


class AppointmentNotFound(Fail, LookupError):
    """No appointment has that id (the job fails at once: a retry would not find it either)."""


class AppointmentBook:
    """Appointments in memory (a real project would open its appointment service's client)."""

    def __init__(self, appointments: dict[int, Appointment]) -> None:
        self.appointments = appointments

    async def get(self, appointment_id: int) -> Appointment:
        try:
            return self.appointments[appointment_id]
        except KeyError:
            raise AppointmentNotFound(f"no appointment {appointment_id}") from None


@dataclasses.dataclass
class SentMessage:
    channel: str
    to: str
    text: str


@dataclasses.dataclass
class MemoryOutbox:
    """Keeps what was sent (a real project would call its email or SMS gateway)."""

    sent: list[SentMessage] = dataclasses.field(default_factory=list)

    async def send(self, channel: str, to: str, text: str) -> None:
        self.sent.append(SentMessage(channel, to, text))


@dataclasses.dataclass
class Services:
    """What handlers and families get as their resources."""

    greeting: str
    appointment_svc: AppointmentBook
    outbox: Outbox


def init() -> Services:
    """The project's services, wired."""
    tomorrow = datetime.now(UTC).replace(hour=9, minute=30, second=0, microsecond=0) + timedelta(days=1)
    book = AppointmentBook({
        1: Appointment(1, "Ada Lovelace", "ada@example.com", tomorrow, "Marylebone Clinic", "Europe/London"),
        2: Appointment(2, "Alan Turing", "+44 20 7946 0000", tomorrow + timedelta(hours=2), "Bletchley Practice",
                       "Europe/London"),
    })
    return Services(greeting="hello from agora-pg", appointment_svc=book, outbox=MemoryOutbox())
