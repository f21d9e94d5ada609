"""Typing text values for a table's columns, and JSON log lines (pure)."""

from __future__ import annotations

import json
import logging
import uuid
from datetime import UTC, date, datetime, time
from decimal import Decimal

import pytest

from agora_pg.logs import JsonFormatter
from agora_pg.pipelines.records import column_typer


def test_text_is_typed_for_the_columns_types_and_other_values_are_left_alone() -> None:
    typer = column_typer({"id": "int8", "amount": "numeric", "at": "timestamptz", "on": "bool", "day": "date",
                          "t": "time", "key": "uuid", "ratio": "float8", "note": "text", "local": "timestamp"})
    assert typer is not None
    record = {"id": " 42 ", "amount": "1.50", "at": "2026-01-02T03:04:05+01:00", "on": "yes", "day": "2026-01-02",
              "t": "10:30", "key": "12345678-1234-5678-1234-567812345678", "ratio": "0.5", "note": " keep ",
              "local": "2026-01-02 03:04:05", "extra": "untouched"}
    typed = typer(record)
    assert typed == {
        "id": 42, "amount": Decimal("1.50"), "at": datetime(2026, 1, 2, 2, 4, 5, tzinfo=UTC), "on": True,
        "day": date(2026, 1, 2), "t": time(10, 30), "key": uuid.UUID("12345678-1234-5678-1234-567812345678"),
        "ratio": 0.5, "note": " keep ", "local": datetime(2026, 1, 2, 3, 4, 5), "extra": "untouched",
    }
    assert record["id"] == " 42 "  # the record as read is kept (for its dead letter)
    assert typer({"id": 7, "amount": Decimal(1)}) == {"id": 7, "amount": Decimal(1)}  # typed already
    assert typer({"id": "", "note": ""}) == {"id": None, "note": ""}  # empty: NULL outside text


@pytest.mark.parametrize(("column", "udt", "text", "words"), [
    ("id", "int4", "three", "column 'id': expected integer, got 'three'"),
    ("at", "timestamptz", "2026-01-02T03:04:05", "column 'at': expected timestamp with a UTC offset"),
    ("on", "bool", "maybe", "column 'on': expected boolean"),
    ("amount", "numeric", "1,5", "column 'amount': expected decimal"),
])
def test_a_value_that_does_not_convert_names_its_column(column: str, udt: str, text: str, words: str) -> None:
    typer = column_typer({column: udt})
    assert typer is not None
    with pytest.raises(ValueError, match=words.replace("(", "\\(")):
        typer({column: text})


def test_a_table_of_text_columns_needs_no_typing() -> None:
    assert column_typer({"name": "text", "tags": "jsonb"}) is None


def test_json_log_lines_carry_time_level_logger_message_and_traceback() -> None:
    formatter = JsonFormatter()
    record = logging.LogRecord("agora_pg", logging.WARNING, __file__, 1, "job %s failed: %s", (7, "é"), None)
    entry = json.loads(formatter.format(record))
    assert (entry["level"], entry["logger"], entry["message"]) == ("WARNING", "agora_pg", "job 7 failed: é")
    assert entry["time"].endswith("+00:00") and "exception" not in entry
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        import sys
        failed = logging.LogRecord("x", logging.ERROR, __file__, 1, "oops", (), sys.exc_info())
    assert "RuntimeError: boom" in json.loads(formatter.format(failed))["exception"]
