"""Text from outside cannot act on a terminal, forge a log line or a metric label."""

from __future__ import annotations

import logging

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from agora_pg.errors import InvalidJob
from agora_pg.job_spec import JobSpec
from agora_pg.logs import TextFormatter
from agora_pg.printable import escape_controls
from agora_pg.runtime.process_metrics import ProcessMetrics


def test_control_and_bidi_characters_become_visible_escapes() -> None:
    assert escape_controls("a\x1b[2Jb") == "a\\x1b[2Jb"
    assert escape_controls("over\rwrite") == "over\\x0dwrite"
    assert escape_controls("user\u202etxt.exe") == "user\\u202etxt.exe"
    assert escape_controls("\x9b31m") == "\\x9b31m"  # a C1 control (CSI)
    assert escape_controls("two\nlines\tand tab") == "two\nlines\tand tab"
    assert escape_controls("two\nlines", newlines="\n    ") == "two\n    lines"
    assert escape_controls("two\nlines\t", newlines=None) == "two\\nlines\\t"
    assert escape_controls("plain text, é and 日本") == "plain text, é and 日本"


@pytest.mark.parametrize("field", ["kind", "queue"])
@pytest.mark.parametrize("bad", ["mail\x1b[2J", "a\rb", "evil\u202e", "two\nlines", "tab\tbed"])
def test_kinds_and_queues_with_control_characters_are_refused(field: str, bad: str) -> None:
    with pytest.raises(InvalidJob, match=f"{field}: must not contain control or bidi characters"):
        JobSpec("mail", **{"queue": bad}) if field == "queue" else JobSpec(bad)


def test_a_text_log_line_escapes_controls_and_indents_what_would_pass_for_a_line_of_its_own() -> None:
    message = "job 1 failed: ValueError: x\n2026-12-06 10:00:00,000 WARNING agora_pg: \x1b[31mforged\x1b[0m"
    record = logging.LogRecord("agora_pg.worker", logging.WARNING, __file__, 1, "%s", (message,), None)
    line = TextFormatter().format(record)
    first, second = line.split("\n")
    assert first.endswith("WARNING agora_pg.worker: job 1 failed: ValueError: x")
    assert second == "    2026-12-06 10:00:00,000 WARNING agora_pg: \\x1b[31mforged\\x1b[0m"


def test_metric_labels_carry_no_raw_control_character() -> None:
    metrics = ProcessMetrics()
    metrics.jobs_recorded([("q\x1b[2J", "k\u202e", "succeeded", 0.1, 0.2)])
    registry = CollectorRegistry()
    registry.register(metrics)
    text = generate_latest(registry).decode()
    assert "\x1b" not in text and "\u202e" not in text
    assert 'queue="q\\\\x1b[2J"' in text and 'kind="k\\\\u202e"' in text

