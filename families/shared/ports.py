"""Ports that more than one family of this project uses."""

from __future__ import annotations

from typing import Protocol


class Outbox(Protocol):
    """Where messages leave the system (an email or SMS gateway's client in production)."""

    async def send(self, channel: str, to: str, text: str) -> None: ...
