"""The API's checks of request bodies and metric labels (pure)."""

from __future__ import annotations

from agora_pg.api.errors import nesting_depth, strict_json
from agora_pg.api.metrics import labelled_queues


def test_nesting_depth_counts_brackets_outside_strings() -> None:
    assert nesting_depth(b'{"kind": "k", "payload": {"a": [1, {"b": []}]}}', 100) == 5
    assert nesting_depth(b'{"kind": "[[[[{{{{", "payload": {"s": "\\"]]]"}}', 100) == 2
    deep = b'{"payload": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    assert nesting_depth(deep, 65) == 66  # stops counting past the limit


def duplicate_key(body: bytes) -> str | None:
    return strict_json(body)[1]


def test_duplicate_keys_are_found_at_any_depth() -> None:
    assert duplicate_key(b'{"kind": "a", "kind": "b"}') == "kind"
    assert duplicate_key(b'{"kind": "a", "payload": {"x": 1, "y": {"z": 1, "z": 2}}}') == "z"
    assert duplicate_key(b'{"kind": "a", "payload": {"x": 1}}') is None
    assert duplicate_key(b"not json") is None


def test_only_the_busiest_queues_become_labels() -> None:
    live = [(f"q{n:03d}", "pending", n) for n in range(120)] + [("q119", "processing", 5)]
    named = labelled_queues(live, limit=50)
    assert len(named) == 50 and "q119" in named and "q070" in named and "q069" not in named
