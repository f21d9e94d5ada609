"""The appointment_reminder family: load -> compose -> deliver, wired in one root.

Resources it needs (from the worker's lifespan): ``appointments`` (a mapping of id to
Appointment) and ``outbox`` (a list of delivered messages).
"""

from __future__ import annotations

from typing import Any

from agora_pg.families import FamilyRegistry
from families.appointment_reminder.ports import ComposePort, DeliverPort, LoadPort, Receipt
from families.appointment_reminder.stages import ComposeReminder, DeliverToOutbox, LoadFromBook

EMAIL_TEMPLATE = "Dear {name}, this is a reminder of your appointment at {clinic} on {day} at {time}."
SMS_TEMPLATE = "{clinic}: appointment {day} {time}. Reply C to cancel."


class AppointmentReminder:
    """The root: runs the three stages for one appointment."""

    def __init__(self, load: LoadPort, compose: ComposePort, deliver: DeliverPort) -> None:
        self.load_stage = load
        self.compose_stage = compose
        self.deliver_stage = deliver

    async def run(self, payload: dict[str, Any]) -> Receipt:
        appointment = await self.load_stage.load(payload["appointment_id"])
        message = self.compose_stage.compose(appointment)
        return await self.deliver_stage.deliver(appointment, message)


class EmailReminder(AppointmentReminder):
    def __init__(self, resources: Any) -> None:
        super().__init__(LoadFromBook(resources.appointments), ComposeReminder(EMAIL_TEMPLATE),
                         DeliverToOutbox(resources.outbox, "email"))


class SmsReminder(AppointmentReminder):
    def __init__(self, resources: Any) -> None:
        super().__init__(LoadFromBook(resources.appointments), ComposeReminder(SMS_TEMPLATE),
                         DeliverToOutbox(resources.outbox, "sms"))


def register_appointment_reminder(registry: FamilyRegistry) -> FamilyRegistry:
    return registry.register("appointment_reminder", "default", EmailReminder).register(
        "appointment_reminder", "sms", SmsReminder)
