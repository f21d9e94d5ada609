"""Text from outside (a queue name, a kind, an error message) made safe to show where it
could act: a terminal, a text log line, a metric label (pure).

Control characters (ESC, which starts terminal escape sequences; CR, which rewrites a
line; the rest of C0 and C1) and the bidirectional overrides (which reorder what a
reader sees) become visible escapes such as ``\\x1b`` and ``\\u202e``."""

from __future__ import annotations

import re

# C0 but tab and newline, DEL, C1, and the bidi marks, embeddings, overrides and isolates
_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def has_unsafe(text: str) -> bool:
    """Whether ``text`` holds a character ``escape_controls`` would escape (or a newline or tab)."""
    return _UNSAFE.search(text) is not None or "\n" in text or "\t" in text


def escape_controls(text: str, *, newlines: str | None = "\n") -> str:
    """``text`` with control and bidi characters escaped. ``newlines``: what each newline
    becomes (``"\\n    "`` indents the lines after the first, so that none can pass for
    a line of its own); None escapes it as ``\\n``."""
    text = _UNSAFE.sub(_escape, text)
    if newlines is None:
        return text.replace("\n", "\\n").replace("\t", "\\t")
    return text if newlines == "\n" else text.replace("\n", newlines)
