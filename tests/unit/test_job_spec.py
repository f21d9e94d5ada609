import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from agora_pg.errors import InvalidJob
from agora_pg.job_spec import JobSpec, batch_columns


def test_row_defaults_name_to_kind_and_serialises_payload() -> None:
    row = JobSpec("send_email", {"to": "a@b.c"}).as_row()
    # (no queue, max_retries or timeout: the statement takes the kind's declared ones, else the defaults)
    assert row == ("send_email", "send_email", None, '{"to":"a@b.c"}', 0, None, None, None, None)


def test_batch_columns_are_one_array_per_column_and_one_json_array_of_payloads() -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=UTC)
    specs = [
        JobSpec("k", {"a": [1, "x"]}),
        JobSpec("k", name="n", queue="q", priority=3, run_at=when, max_retries=1, dedup_key="d", timeout_seconds=2.5),
    ]
    names, kinds, queues, payloads, priorities, run_ats, max_retries, dedup_keys, timeouts = batch_columns(specs)
    assert (names, kinds, queues, priorities, run_ats) == ([None, "n"], ["k", "k"], [None, "q"], [None, 3], [None, when])
    assert (max_retries, dedup_keys, timeouts) == ([None, 1], [None, "d"], [None, 2.5])
    assert json.loads(payloads) == [{"a": [1, "x"]}, {}]


def test_a_column_no_spec_sets_is_sent_as_null() -> None:
    # (the statement fills in the default: name = kind, priority 0, run_at now, ...)
    columns = batch_columns([JobSpec("k"), JobSpec("k2")])
    assert columns[:4] == (None, ["k", "k2"], None, "[{},{}]")
    assert columns[4:] == (None, None, None, None, None)


@pytest.mark.parametrize("payload", [{"bad": object()}, {"nan": float("nan")}, {"nul": "a\x00b"}])
def test_batch_columns_name_the_bad_payload(payload: dict[str, object]) -> None:
    with pytest.raises(InvalidJob) as caught:
        batch_columns([JobSpec("k", {"fine": 1}), JobSpec("k", payload)])
    assert caught.value.field == "payload"


@pytest.mark.parametrize(
    ("kwargs", "field", "message"),
    [
        ({"kind": ""}, "kind", "must not be empty"),
        ({"kind": " padded "}, "kind", "whitespace"),
        ({"kind": 5}, "kind", "expected a string"),
        ({"kind": "k", "payload": [1, 2]}, "payload", "expected a JSON object"),
        ({"kind": "k", "queue": ""}, "queue", "must not be empty"),
        ({"kind": "k", "priority": 1.5}, "priority", "whole number"),
        ({"kind": "k", "priority": 2**40}, "priority", "must be between"),
        ({"kind": "k", "max_retries": -1}, "max_retries", "must be between 0"),
        ({"kind": "k", "max_retries": True}, "max_retries", "whole number"),
        ({"kind": "k", "run_at": datetime(2030, 1, 1)}, "run_at", "naive"),
        ({"kind": "k", "run_at": "2030-01-01"}, "run_at", "expected a datetime"),
        ({"kind": "k", "dedup_key": ""}, "dedup_key", "must not be empty"),
        ({"kind": "k\x00"}, "kind", "NUL"),
        ({"kind": "k", "timeout_seconds": 0}, "timeout_seconds", "more than 0"),
        ({"kind": "k", "timeout_seconds": float("nan")}, "timeout_seconds", "more than 0"),
        ({"kind": "k", "timeout_seconds": "30"}, "timeout_seconds", "number of seconds"),
    ],
)
def test_invalid_specs_name_the_field(kwargs: dict, field: str, message: str) -> None:
    with pytest.raises(InvalidJob) as caught:
        JobSpec(**kwargs)
    assert caught.value.field == field
    assert message in str(caught.value)


@pytest.mark.parametrize("payload", [{"x": object()}, {"x": float("nan")}, {"x": "a\x00b"}])
def test_payloads_postgres_cannot_store_are_rejected(payload: dict) -> None:
    with pytest.raises(InvalidJob) as caught:
        JobSpec("k", payload).as_row()
    assert caught.value.field == "payload"


def test_aware_run_at_is_accepted() -> None:
    when = datetime(2030, 1, 1, tzinfo=UTC)
    assert JobSpec("k", run_at=when).as_row()[5] == when


@pytest.mark.parametrize("field", ["kind", "queue", "name", "dedup_key"])
def test_text_postgresql_cannot_hold_is_refused(field: str) -> None:
    kwargs: dict[str, object] = {"kind": "k", field: "bad \ud800 text"}
    with pytest.raises(InvalidJob) as caught:
        JobSpec(**kwargs)  # type: ignore[arg-type]
    assert caught.value.field == field and "UTF-8" in caught.value.problem


def test_a_backslash_then_u0000_is_text_not_a_nul() -> None:
    assert JobSpec("k", {"path": "C:\\u0000"}).payload_json() == '{"path":"C:\\\\u0000"}'
    assert JobSpec("k", {"x": "\\\\\\u0000"}).payload_json()  # three backslashes, then u0000: text
    with pytest.raises(InvalidJob, match="NUL"):
        JobSpec("k", {"x": "\\\x00"}).payload_json()  # a backslash, then a real NUL
    with pytest.raises(InvalidJob, match="NUL"):
        batch_columns([JobSpec("k", {"x": "ok"}), JobSpec("k", {"x": "a\x00"})])


@pytest.mark.parametrize("run_at", [
    datetime(1, 1, 1, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
    datetime(9999, 12, 31, 23, 59, 59, tzinfo=timezone(timedelta(hours=-14))),
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=14))),
    datetime(1969, 12, 31, 23, 59, tzinfo=UTC),
])
def test_times_the_database_cannot_hold_are_refused(run_at: datetime) -> None:
    with pytest.raises(InvalidJob, match="run_at: must be between 1970-01-01 and 9000-01-01"):
        JobSpec("k", run_at=run_at)


def test_queue_names_are_short_enough_for_labels() -> None:
    JobSpec("k", queue="q" * 100)
    with pytest.raises(InvalidJob, match="queue: longer than 100 characters"):
        JobSpec("k", queue="q" * 101)
