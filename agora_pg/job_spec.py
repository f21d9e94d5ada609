"""What an enqueue asks for, checked before it reaches the database. Pure."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from agora_pg.printable import escape_controls, has_unsafe
from agora_pg.errors import InvalidJob
from agora_pg.payloads import is_payload_instance, to_json_object

INT32_MAX = 2**31 - 1
MAX_TEXT = 1000  # kind, name, queue and dedup_key are identifiers, not documents
MAX_QUEUE = 100  # queue names are metric labels too
RESERVED_QUEUE_PREFIX = "agora:"  # queues of agora-pg's own (its scheduler's runs): no public producer writes them
# Times the database and every client can hold (PostgreSQL would turn year 1 into
# -infinity; years past 9999 overflow Python's datetime).
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(9000, 1, 1, tzinfo=UTC)
# A \u0000 escape in JSON text: the backslash before "u" is not itself escaped (an odd
# number of backslashes), so the text ``\\u0000`` (a backslash, then "u0000") is not one.
_NUL_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")


def time_problem(value: datetime) -> str | None:
    """Why an aware datetime is out of the range agora-pg accepts, or None."""
    try:
        utc = value.astimezone(UTC)
    except OverflowError:
        utc = None
    if utc is None or not EARLIEST <= utc < LATEST:
        return f"must be between {EARLIEST:%Y-%m-%d} and {LATEST:%Y-%m-%d} (UTC), got {value.isoformat()}"
    return None


def holds_nul(json_text: str) -> bool:
    """True when JSON text holds the NUL character (which PostgreSQL's jsonb refuses)."""
    return "\\u0000" in json_text and _NUL_ESCAPE.search(json_text) is not None


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One job to enqueue. ``payload`` is a dict, or a dataclass or ``msgspec.Struct``
    instance (stored as its JSON object). ``name`` defaults to ``kind``; ``queue`` to the
    kind's (through a Queue that knows the kinds), else ``"default"``; ``run_at`` to now;
    ``max_retries`` to the kind's, else the enqueuing process's ``WORKER_MAX_RETRIES``;
    ``timeout_seconds`` to the kind's timeout, else the worker's ``WORKER_JOB_TIMEOUT``."""

    kind: str
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)
    name: str | None = None
    queue: str | None = None
    priority: int = 0
    run_at: datetime | None = None
    max_retries: int | None = None
    dedup_key: str | None = None
    timeout_seconds: float | None = None

    def __post_init__(self) -> None:
        _known_identifier("kind", self.kind)
        if self.name is not None:
            _identifier("name", self.name, allow_spaces=True)
        if self.queue is not None:
            _known_identifier("queue", self.queue, MAX_QUEUE)
        if self.dedup_key is not None:
            _identifier("dedup_key", self.dedup_key, allow_spaces=True)
        if is_payload_instance(self.payload):  # a typed payload: stored as its JSON object
            object.__setattr__(self, "payload", to_json_object(self.payload))
        if not isinstance(self.payload, dict):
            raise InvalidJob("payload", f"expected a JSON object (dict), got {type(self.payload).__name__}")
        _whole_number("priority", self.priority, minimum=-INT32_MAX)
        if self.max_retries is not None:
            _whole_number("max_retries", self.max_retries, minimum=0)
        if self.timeout_seconds is not None:
            _timeout("timeout_seconds", self.timeout_seconds)
        if self.run_at is not None:
            if not isinstance(self.run_at, datetime):
                raise InvalidJob("run_at", f"expected a datetime, got {type(self.run_at).__name__}")
            if self.run_at.tzinfo is None or self.run_at.utcoffset() is None:
                raise InvalidJob("run_at", "expected a timezone-aware datetime, got a naive one")
            problem = time_problem(self.run_at)
            if problem is not None:
                raise InvalidJob("run_at", problem)

    def payload_json(self) -> str:
        try:
            text = json.dumps(self.payload, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as error:
            raise InvalidJob("payload", f"not JSON-serialisable: {error}") from None
        if holds_nul(text):
            raise InvalidJob("payload", "PostgreSQL cannot store the NUL character (\\u0000) in JSON")
        return text

    def as_row(self) -> tuple[Any, ...]:
        """Values in the column order of ``queries.INSERT_JOB``."""
        return (
            self.name if self.name is not None else self.kind,
            self.kind,
            self.queue,  # (None: the kind's, else "default")
            self.payload_json(),
            self.priority,
            self.run_at,
            self.max_retries,
            self.dedup_key,
            self.timeout_seconds,
        )


def refuse_reserved_queue(spec: JobSpec) -> JobSpec:
    """``spec``, unless its queue is one of agora-pg's own (``InvalidJob`` then)."""
    if spec.queue is not None and spec.queue.startswith(RESERVED_QUEUE_PREFIX):
        raise InvalidJob("queue", f"queue names beginning {RESERVED_QUEUE_PREFIX!r} are agora-pg's own "
                                  f"(its scheduler's runs), got {spec.queue!r}")
    return spec


def batch_columns(specs: Sequence[JobSpec]) -> tuple[Any, ...]:
    """Many specs as the nine parameters of ``queries.INSERT_JOBS``: one array per
    column, in the order of ``JobSpec.as_row``, except the payloads, which are one JSON
    array (one ``json.dumps`` for the batch, split by the server). A column every spec
    leaves unset (no name, priority 0, no run_at, ...) is sent as NULL instead of an
    array: the statement fills in its default.

    Columns instead of one JSON document of rows: PostgreSQL reads array parameters
    about three times as fast as it turns JSON objects into rows (5,000-job batches:
    the statement's server time fell from about 9.6 to 5.3 us a job)."""
    try:
        payloads = json.dumps([spec.payload for spec in specs], allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError):
        payloads = None
    if payloads is None or holds_nul(payloads):
        for spec in specs:
            spec.payload_json()  # raises InvalidJob for the first bad payload
    if payloads is None:  # pragma: no cover - every failure above is a payload's
        raise InvalidJob("payload", "not JSON-serialisable")
    return (
        _unless_all_none([spec.name for spec in specs]),
        [spec.kind for spec in specs],
        _unless_all_none([spec.queue for spec in specs]),
        payloads,
        _unless_all_none([spec.priority or None for spec in specs]),
        _unless_all_none([spec.run_at for spec in specs]),
        _unless_all_none([spec.max_retries for spec in specs]),
        _unless_all_none([spec.dedup_key for spec in specs]),
        _unless_all_none([spec.timeout_seconds for spec in specs]),
    )


def _unless_all_none(values: list[Any]) -> list[Any] | None:
    return None if all(value is None for value in values) else values


# Kinds and queues that passed _identifier: a batch of thousands of specs repeats a
# handful, and checking each again was a third of building a spec.
_KNOWN_IDENTIFIERS: set[str] = set()
_KNOWN_IDENTIFIERS_MAX = 4096


def _known_identifier(field: str, value: object, max_length: int = MAX_TEXT) -> None:
    if type(value) is str and value in _KNOWN_IDENTIFIERS and len(value) <= max_length:
        return
    _identifier(field, value, max_length=max_length)
    if len(_KNOWN_IDENTIFIERS) >= _KNOWN_IDENTIFIERS_MAX:
        _KNOWN_IDENTIFIERS.clear()
    _KNOWN_IDENTIFIERS.add(value)  # type: ignore[arg-type]  # _identifier checked it is a str


def _identifier(field: str, value: object, *, allow_spaces: bool = False, max_length: int = MAX_TEXT) -> None:
    if not isinstance(value, str):
        raise InvalidJob(field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise InvalidJob(field, "must not be empty")
    if len(value) > max_length:
        raise InvalidJob(field, f"longer than {max_length} characters")
    if "\x00" in value:
        raise InvalidJob(field, "must not contain NUL characters")
    if not value.isascii():
        try:
            value.encode()
        except UnicodeEncodeError:
            raise InvalidJob(field, "not valid UTF-8 text (a lone surrogate)") from None
    if not allow_spaces and value != value.strip():
        raise InvalidJob(field, "must not start or end with whitespace")
    if not allow_spaces and has_unsafe(value):  # (a kind or a queue: shown in terminals, logs, metric labels)
        raise InvalidJob(field, f"must not contain control or bidi characters, got {escape_controls(value, newlines=None)!r}")


MAX_TIMEOUT_SECONDS = 365 * 24 * 3600.0


def _timeout(field: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidJob(field, f"expected a number of seconds, got {type(value).__name__}")
    if not 0 < value <= MAX_TIMEOUT_SECONDS:  # (also refuses NaN)
        raise InvalidJob(field, f"must be more than 0 and at most {MAX_TIMEOUT_SECONDS:.0f} seconds (a year), got {value!r}")


def _whole_number(field: str, value: object, *, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidJob(field, f"expected a whole number, got {type(value).__name__}")
    if not minimum <= value <= INT32_MAX:
        raise InvalidJob(field, f"must be between {minimum} and {INT32_MAX}, got {value}")
