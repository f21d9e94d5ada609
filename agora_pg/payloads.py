"""Typed payloads: a kind may declare its payload as a dataclass or a ``msgspec.Struct``.
The payload is checked (and turned into JSON values) when it is enqueued, and decoded
into that type for the handler. Pure: no I/O.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

import msgspec

from agora_pg.errors import InvalidJob

_PATH = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_MISSING = re.compile(r"missing required field `(?P<name>[^`]+)`")


def is_payload_type(candidate: object) -> bool:
    """A dataclass or ``msgspec.Struct`` class."""
    return isinstance(candidate, type) and (
        dataclasses.is_dataclass(candidate) or issubclass(candidate, msgspec.Struct))


def is_payload_instance(value: object) -> bool:
    """A dataclass or ``msgspec.Struct`` instance: a payload given as a typed value."""
    return isinstance(value, msgspec.Struct) or (dataclasses.is_dataclass(value) and not isinstance(value, type))


def to_json_object(value: Any) -> Any:
    """A typed payload as JSON values (``datetime`` as ISO 8601 text, and so on)."""
    return msgspec.to_builtins(value)


def check_payload(payload: Any, payload_type: type) -> dict[str, Any]:
    """``payload`` (a dict, or an instance of ``payload_type``) as the JSON object it is
    stored as, once it is known to decode into ``payload_type``. ``InvalidJob`` names the
    field (``payload.to``, ``payload.items[2].sku``) otherwise."""
    value = payload if isinstance(payload, payload_type) else decode(payload, payload_type)
    document = to_json_object(value)
    if not isinstance(document, dict):
        raise InvalidJob("payload", f"{payload_type.__name__} does not encode to a JSON object")
    return document


def decode(payload: Any, payload_type: type) -> Any:
    """The stored payload (JSON values) as ``payload_type``; ``InvalidJob`` naming the field."""
    try:
        return msgspec.convert(payload, payload_type, strict=False)
    except msgspec.ValidationError as error:
        message = str(error)
        match = _PATH.search(message)
        field = "payload" + (match.group("path") if match else "")
        problem = message[:match.start()] if match else message
        missing = _MISSING.search(problem)
        if missing:
            field += f".{missing.group('name')}"
        raise InvalidJob(field, f"{problem} (payload type {payload_type.__name__})") from None
