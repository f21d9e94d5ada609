"""The stages of the appointment_reminder family, as interfaces."""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Appointment:
    id: int
    patient_name: str
    contact: str
    starts_at: datetime
    clinic: str
    timezone: str = "UTC"  # the clinic's (an IANA name): reminders show its local time


@dataclasses.dataclass(frozen=True)
class Message:
    to: str
    text: str


@dataclasses.dataclass(frozen=True)
class Receipt:
    appointment_id: int
    channel: str
    to: str


class LoadPort(Protocol):
    async def load(self, appointment_id: int) -> Appointment: ...


class ComposePort(Protocol):
    def compose(self, appointment: Appointment) -> Message: ...


class DeliverPort(Protocol):
    async def deliver(self, appointment: Appointment, message: Message) -> Receipt: ...
