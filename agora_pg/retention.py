"""How long finished history is kept: ages such as ``30d`` (pure).

A finished job (done, cancelled, or failed with no retry left) whose last attempt ended
longer ago than its age is deleted with its runs; so are pipeline runs that ended longer
ago than ``finished`` and dead letters replayed longer ago than it. Live jobs, runs in
progress and dead letters waiting for a replay are never touched.
"""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta

from agora_pg.errors import ConfigError

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGE = re.compile(r"([0-9]+)\s*([smhdw])")


def parse_age(text: str, key: str) -> timedelta:
    """``"30d"`` -> 30 days (units s, m, h, d, w; at least one minute)."""
    match = _AGE.fullmatch(text.strip().lower())
    if match is None:
        raise ConfigError(key, f"expected an age such as 30d, 12h or 2w, got {text!r}")
    age = timedelta(seconds=int(match.group(1)) * _UNITS[match.group(2)])
    if age < timedelta(minutes=1):
        raise ConfigError(key, f"must be at least a minute, got {text!r}")
    return age


@dataclasses.dataclass(frozen=True)
class Retention:
    """Ages after which finished history goes: ``finished`` for done and cancelled jobs,
    pipeline runs and replayed dead letters; ``failed`` for jobs that failed for good
    (kept longer by default: they are what someone comes back to look at)."""

    finished: timedelta
    failed: timedelta

    def __post_init__(self) -> None:
        if self.failed < self.finished:
            raise ConfigError("--keep-failed", "failed jobs cannot be kept for less time than the others")


@dataclasses.dataclass
class PruneReport:
    """What one pruning deleted (job runs go with their jobs)."""

    jobs: int = 0
    pipeline_runs: int = 0
    dead_letters: int = 0
    busy: bool = False  # another process was pruning: this one did nothing
