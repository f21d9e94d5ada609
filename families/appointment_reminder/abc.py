"""The appointment_reminder family's ports: one per node of ``pipeline.yaml`` (each with
the one method its stages implement), the service it needs and the root's interface."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from datetime import datetime
from typing import Protocol


@dataclasses.dataclass(frozen=True)
class Appointment:
    id: int
    patient_name: str
    contact: str  # an email address or a phone number
    starts_at: datetime
    clinic: str
    timezone: str = "UTC"  # the clinic's (an IANA name): reminders show its local time


@dataclasses.dataclass(frozen=True)
class Message:
    appointment_id: int
    to: str
    text: str


@dataclasses.dataclass(frozen=True)
class Reminder:
    """What a run returns: the reminder as sent."""

    appointment_id: int
    channel: str
    to: str
    text: str


class AppointmentService(Protocol):
    """The appointments the family reads (the composition root provides one)."""

    async def get(self, appointment_id: int) -> Appointment: ...


class LoadPort(ABC):
    @abstractmethod
    async def load(self, appointment_id: int) -> Appointment: ...


class ComposePort(ABC):
    @abstractmethod
    def compose(self, appointment: Appointment) -> Message: ...


class DeliverPort(ABC):
    @abstractmethod
    async def deliver(self, message: Message) -> Reminder: ...


class AppointmentReminderPipeline(Protocol):
    """The root: ``reminder = await pipeline.run(appointment_id)``."""

    async def run(self, appointment_id: int) -> Reminder: ...
