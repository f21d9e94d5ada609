"""Progress reports and event values (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from agora_pg import progress
from agora_pg.events.model import (
    Event,
    EventFilter,
    InvalidCursor,
    cursor_of,
    event_of_notification,
    parse_cursor,
    sse_body,
    sse_frames,
)

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def test_a_job_report_keeps_counts_and_caps_the_message() -> None:
    report = progress.job_progress(3, 10, "x" * 2000, NOW)
    assert (report["done"], report["total"]) == (3, 10)
    assert len(report["message"]) == progress.MAX_MESSAGE_CHARS and report["message"].endswith("…")
    assert progress.job_progress(0.5, None, "a\x00b", NOW)["message"] == "ab"
    assert json.loads(progress.as_json(report))["at"] == NOW.isoformat()


@pytest.mark.parametrize(
    ("done", "total", "message", "error"),
    [(True, None, None, TypeError), ("3", None, None, TypeError), (-1, None, None, ValueError),
     (float("inf"), None, None, ValueError), (1, float("nan"), None, ValueError), (1, 2, 3, TypeError)],
)
def test_bad_reports_are_refused_with_the_reason(done: object, total: object, message: object,
                                                  error: type[Exception]) -> None:
    with pytest.raises(error, match="progress"):
        progress.job_progress(done, total, message, NOW)  # type: ignore[arg-type]


def test_cursors_round_trip_and_refuse_what_the_stream_never_gave() -> None:
    moment = NOW - timedelta(minutes=5, microseconds=7)
    assert parse_cursor(cursor_of(moment), NOW) == moment
    assert parse_cursor(cursor_of(NOW + timedelta(hours=1)), NOW) == NOW  # a future cursor reads from now
    for text in ("", "-5", "12a", "１２", "9" * 18, cursor_of(NOW - timedelta(days=8))):
        with pytest.raises(InvalidCursor):
            parse_cursor(text, NOW)


def test_filters_combine() -> None:
    event = Event("job.finished", {"job_id": 7, "kind": "mail", "queue": "q"}, ("finished", 1), NOW)
    assert EventFilter().matches(event)
    assert EventFilter(kind="mail", queue="q").matches(event)
    assert not EventFilter(kind="mail", queue="other").matches(event)
    assert not EventFilter(job_id=8).matches(event)
    assert not EventFilter(pipeline_id="p").matches(event)
    run = Event("job.finished", {"job_id": 8, "kind": "p", "queue": "agora:pipelines", "pipeline_id": "p"},
                ("finished", 2), NOW)
    assert EventFilter(pipeline_id="p").matches(run)  # a job that runs a schedule's tick names it
    assert not EventFilter(pipeline_id="mail").matches(run)
    assert not EventFilter(pipeline_id="mail").matches(event)  # a job of kind "mail" is no pipeline's


def test_notifications_become_progress_events_or_wake_ups() -> None:
    event = event_of_notification('{"type": "job.progress", "job_id": 3, "progress": {"done": 1}}')
    assert event is not None and (event.type, event.job_id, event.key) == ("job.progress", 3, None)
    for payload in ("", "not json", "[1]", '{"type": "job.finished"}'):
        assert event_of_notification(payload) is None


def test_frames_give_ids_to_state_changes_the_last_one_the_new_cursor() -> None:
    changed = Event("job.enqueued", {"job_id": 1}, ("job.enqueued", 1), NOW)
    moved = Event("job.progress", {"job_id": 1})
    ended = Event("job.finished", {"job_id": 1}, ("finished", 9), NOW)
    text = sse_frames([(e, sse_body(e)) for e in (changed, ended, moved)], "100", "200").decode()
    frames = [frame for frame in text.split("\n\n") if frame]
    assert frames[0].startswith("id: 100\nevent: job.enqueued\ndata: {")
    assert frames[1].startswith("id: 200\nevent: job.finished")
    assert frames[2].startswith("event: job.progress")  # no id: progress is not replayed
    assert json.loads(frames[0].split("data: ", 1)[1]) == {"type": "job.enqueued", "job_id": 1}
