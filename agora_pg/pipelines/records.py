"""Records, batches and the typing of text values (pure)."""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Callable, Mapping
from datetime import date, datetime, time
from decimal import Decimal
from typing import Any

from agora_pg.errors import ConfigError

Record = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class Rejected:
    """A record a stage refused, and why."""

    stage: str
    record: Any
    error: BaseException


@dataclasses.dataclass(frozen=True)
class Batch:
    """Records read together, the source position after them (None for a source that
    cannot resume), and the rows the source itself could not read."""

    records: list[Record]
    position: Any = None
    rejected: list[Rejected] = dataclasses.field(default_factory=list)


def _bool(text: str) -> bool:
    value = text.strip().lower()
    if value in {"true", "t", "yes", "y", "1"}:
        return True
    if value in {"false", "f", "no", "n", "0"}:
        return False
    raise ValueError(f"not a boolean: {text!r}")


def _datetime(text: str) -> datetime:
    value = datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        raise ValueError(f"timestamp without a UTC offset: {text!r}")
    return value


CONVERTERS: dict[str, Callable[[str], Any]] = {
    "str": str,
    "int": int,  # int(), float() and Decimal() accept surrounding spaces themselves
    "float": float,
    "decimal": Decimal,
    "bool": _bool,
    "date": lambda text: date.fromisoformat(text.strip()),
    "datetime": _datetime,
    "json": json.loads,
}


# How a text value (a CSV cell) becomes a value for a column of these PostgreSQL types
# (``information_schema.columns.udt_name``); other types take the text as it is.
def _naive_datetime(text: str) -> datetime:
    return datetime.fromisoformat(text.strip())


COLUMN_CONVERTERS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "int2": ("integer", int), "int4": ("integer", int), "int8": ("integer", int),
    "float4": ("number", float), "float8": ("number", float), "numeric": ("decimal", Decimal),
    "bool": ("boolean", _bool),
    "date": ("date", lambda text: date.fromisoformat(text.strip())),
    "timestamptz": ("timestamp with a UTC offset", _datetime),
    "timestamp": ("timestamp", _naive_datetime),
    "time": ("time", lambda text: time.fromisoformat(text.strip())),
    "uuid": ("uuid", lambda text: uuid.UUID(text.strip())),
}


def column_typer(column_types: Mapping[str, str]) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
    """A function that types the text values of a record for a table whose columns have
    ``column_types`` (column -> udt_name): an empty text becomes None in a non-text
    column, other text is converted; non-text values are left alone. Raises
    ``ValueError`` naming the column. None when no column needs it."""
    converters = {column: COLUMN_CONVERTERS[udt] for column, udt in column_types.items() if udt in COLUMN_CONVERTERS}
    if not converters:
        return None

    def type_record(record: dict[str, Any]) -> dict[str, Any]:
        changed: dict[str, Any] | None = None
        for column, (type_name, convert) in converters.items():
            value = record.get(column)
            if not isinstance(value, str):
                continue
            if changed is None:
                changed = dict(record)
            if not value.strip():
                changed[column] = None
                continue
            try:
                changed[column] = convert(value)
            except (ValueError, ArithmeticError) as error:
                raise ValueError(f"column {column!r}: expected {type_name}, got {value!r} ({error})") from None
        return record if changed is None else changed

    return type_record


def check_schema(schema: Mapping[str, str], key: str) -> dict[str, str]:
    """A column -> type name mapping whose types are known."""
    for column, type_name in schema.items():
        if type_name not in CONVERTERS:
            raise ConfigError(f"{key}.{column}", f"expected one of {', '.join(CONVERTERS)}, got {type_name!r}")
    return dict(schema)


def typed(row: dict[str, Any], schema: Mapping[str, str]) -> Record:
    """Convert the schema's columns of a text row in place (and return it); an empty
    cell is None. Raises ``ValueError`` naming the column for a value that does not
    convert, leaving the row as it was read."""
    converted: Record = {}
    for column, type_name in schema.items():
        text = row.get(column)
        if text is None or text == "":
            converted[column] = None
            continue
        try:
            converted[column] = CONVERTERS[type_name](text)
        except (ValueError, ArithmeticError) as error:
            raise ValueError(f"column {column!r}: expected {type_name}, got {text!r} ({error})") from None
    row.update(converted)
    return row


def to_json(record: Any) -> str:
    """A record as one line of JSON (dates, decimals and the like as strings)."""
    return json.dumps(record, default=_json_default, ensure_ascii=False, separators=(",", ":"))


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")
