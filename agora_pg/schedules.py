"""When scheduled pipelines run: pure arithmetic, clock-free (``now`` is an argument).

Cron times are wall-clock times in a named zone. Across daylight-saving changes:
a wall-clock time that a spring-forward change skips runs shifted forward by the
gap (02:30 on the night clocks jump from 02:00 to 03:00 runs at 03:30), and a
wall-clock time that a fall-back change repeats runs once, at its first occurrence.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter

from agora_pg.errors import InvalidSchedule

ERROR_BACKOFF_CAP_SECONDS = 600.0  # the seed: exponential, capped at 10 minutes
# A schedule no live process has declared for this long is orphaned: its code is gone or
# its workers are down (a scheduler declares its schedules at most every 10 s, and passes
# at least every 30 s). Mirrored by migration 0023's agora.schedule_health view.
SCHEDULE_ORPHANED_AFTER_SECONDS = 120
SCHEDULE_DECLARED_EVERY_SECONDS = 10


@dataclasses.dataclass(frozen=True)
class NextRun:
    """When a schedule's next run starts: at ``at`` (a cron tick), else ``in_seconds``
    after the previous run ended (by the database clock), else (both None) never."""

    at: datetime | None = None
    in_seconds: float | None = None

    def at_time(self, finished_at: datetime) -> datetime | None:
        """The next run as a time, given when the previous one finished."""
        if self.at is not None:
            return self.at
        return None if self.in_seconds is None else finished_at + timedelta(seconds=self.in_seconds)



# The five fields of a cron expression and the values each takes.
CRON_FIELDS = (("minute", "0-59"), ("hour", "0-23"), ("day of month", "1-31"), ("month", "1-12 or JAN-DEC"),
               ("day of week", "0-6 or SUN-SAT"))


def cron_problem(expression: object) -> str | None:
    """What is wrong with a 5-field cron expression, naming the bad field and its range
    (None: it is valid)."""
    if not isinstance(expression, str):
        return f"expected a cron expression (text), got {type(expression).__name__}"
    fields = expression.split()
    if len(fields) != 5:
        return (f"expected 5 fields (minute hour day-of-month month day-of-week) such as '0 */6 * * *', "
                f"got {len(fields)}")
    for index, (name, values) in enumerate(CRON_FIELDS):
        alone = " ".join(field if place == index else "*" for place, field in enumerate(fields))
        if not croniter.is_valid(alone):
            return (f"the {name} field {fields[index]!r} is not valid: it takes {values}, "
                    "lists (1,5), ranges (1-5) and steps (*/15)")
    if not croniter.is_valid(expression):
        return "expected a cron expression such as '0 */6 * * *'"
    return None


class ScheduleKind(str, enum.Enum):
    EVERY = "every"
    CRON = "cron"
    CONTINUOUS = "continuous"
    ONCE = "once"


@dataclasses.dataclass(frozen=True)
class Schedule:
    """When a ``ScheduledPipeline`` runs; build one with ``every``, ``cron``,
    ``continuous`` or ``once``."""

    kind: ScheduleKind
    interval_seconds: float | None = None
    expression: str | None = None
    timezone: str = "UTC"
    once_key: str | None = None  # Schedule.once(key=...): once ever for this key

    @classmethod
    def every(cls, *, seconds: float = 0, minutes: float = 0, hours: float = 0, days: float = 0) -> Schedule:
        """The next run starts this long after the previous run finished."""
        for name, value in (("seconds", seconds), ("minutes", minutes), ("hours", hours), ("days", days)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise InvalidSchedule(f"Schedule.every({name}=...): expected a number >= 0, got {value!r}")
        total = seconds + 60 * minutes + 3600 * hours + 86400 * days
        if total <= 0:
            raise InvalidSchedule("Schedule.every() needs a positive duration, e.g. Schedule.every(minutes=15)")
        return cls(ScheduleKind.EVERY, interval_seconds=float(total))

    @classmethod
    def cron(cls, expression: str, timezone: str = "UTC") -> Schedule:
        """Runs at the wall-clock times of a 5-field cron expression in ``timezone``."""
        problem = cron_problem(expression)
        if problem:
            raise InvalidSchedule(f"Schedule.cron({expression!r}): {problem}")
        try:
            ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError):
            raise InvalidSchedule(f"Schedule.cron(timezone={timezone!r}): unknown time zone") from None
        return cls(ScheduleKind.CRON, expression=" ".join(expression.split()), timezone=timezone)

    @classmethod
    def continuous(cls) -> Schedule:
        """The next run starts as soon as the previous one finishes."""
        return cls(ScheduleKind.CONTINUOUS)

    @classmethod
    def once(cls, key: str | None = None) -> Schedule:
        """One successful run per launch: each ``start()`` (or start of the worker that
        registers it) runs the pipeline once, then its loop ends; launches at the same
        moment take turns, never overlapping. With ``key`` (an idempotency key, for
        backfills): one successful run ever for that pipeline id and key; a launch with
        a key that already ran does nothing."""
        if key is not None and (not isinstance(key, str) or not key.strip() or len(key) > 200
                                or any(not c.isprintable() for c in key)):
            raise InvalidSchedule(
                f"Schedule.once(key={key!r}): expected a non-empty printable text of at most 200 characters"
            )
        return cls(ScheduleKind.ONCE, once_key=key)

    @property
    def once_per_launch(self) -> bool:
        """A ``once`` schedule without a key: it runs again at every launch."""
        return self.kind is ScheduleKind.ONCE and self.once_key is None

    @property
    def spec(self) -> str:
        """A canonical text form, stored in ``agora.schedules.schedule_spec``."""
        if self.kind is ScheduleKind.EVERY:
            return f"every {self.interval_seconds:g}s"
        if self.kind is ScheduleKind.CRON:
            return f"cron {self.expression} {self.timezone}"
        if self.once_key is not None:
            return f"once key={self.once_key}"
        return str(self.kind.value)

    def first_run_at(self, now: datetime) -> datetime | None:
        """When a newly registered (or changed) schedule first runs: the next cron
        tick after ``now``; None for the others, which run at once (now by the
        database clock)."""
        if self.kind is ScheduleKind.CRON:
            return next_cron_tick(self._expression, self.timezone, now)
        return None

    def next_run_after_success(self, finished_at: datetime, tick: datetime) -> NextRun:
        """When the run after a successful one starts. ``finished_at`` is when the run
        ended and ``tick`` the time it was scheduled for (a cron schedule's next tick
        is after both, so a run that ends before its own tick by some clock never
        gets the same tick again)."""
        if self.kind is ScheduleKind.EVERY:
            assert self.interval_seconds is not None
            return NextRun(in_seconds=self.interval_seconds)
        if self.kind is ScheduleKind.CRON:
            return NextRun(at=next_cron_tick(self._expression, self.timezone, max(finished_at, tick)))
        if self.kind is ScheduleKind.CONTINUOUS:
            return NextRun(in_seconds=0.0)
        return NextRun()

    @property
    def _expression(self) -> str:
        assert self.expression is not None
        return self.expression


@functools.lru_cache(maxsize=4096)  # the pipelines of a process often share a schedule and a tick
def next_cron_tick(expression: str, timezone: str, after: datetime) -> datetime:
    """The first instant strictly after ``after`` (aware) whose wall-clock time in
    ``timezone`` matches ``expression``; returned in UTC. Missed ticks are not
    replayed: callers pass the time the previous run finished."""
    if after.tzinfo is None:
        raise ValueError("after must be timezone-aware")
    zone = ZoneInfo(timezone)
    after_utc = after.astimezone(UTC)
    wall_clock = after_utc.astimezone(zone).replace(tzinfo=None)
    ticks = croniter(expression, wall_clock)
    while True:
        candidate_wall: datetime = ticks.get_next(datetime)
        # fold=0: a repeated time is its first occurrence; a skipped time lands after the gap
        candidate: datetime = candidate_wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
        if candidate > after_utc:
            return candidate


TICK_FIELD = "scheduled_for"  # the payload key of a run's tick (ISO 8601, UTC)


class Scheduled:
    """What runs on a schedule (a pipeline, a periodic job), checked: ``TypeError`` or
    ``ValueError`` naming the first argument that is wrong."""

    def __init__(self, schedule: Schedule, pipeline_id: str, error_backoff_seconds: float,
                 max_consecutive_errors: int) -> None:
        if not isinstance(schedule, Schedule):
            raise TypeError(f"schedule must be a Schedule (Schedule.every(...), ...), got {type(schedule).__name__}")
        if not isinstance(pipeline_id, str) or not pipeline_id.strip():
            raise ValueError("pipeline_id must be a non-empty string")
        if error_backoff_seconds < 0:
            raise ValueError("error_backoff_seconds must be >= 0")
        if max_consecutive_errors < 1:
            raise ValueError("max_consecutive_errors must be >= 1")
        self.schedule = schedule
        self.pipeline_id = pipeline_id  # its row of agora.schedules
        self.error_backoff_seconds = float(error_backoff_seconds)
        self.max_consecutive_errors = max_consecutive_errors


def error_backoff(consecutive_errors: int, base_seconds: float) -> float:
    """Seconds to wait after the n-th failure in a row (n >= 1):
    ``min(600, base_seconds * 2**(n-1))``."""
    if consecutive_errors < 1:
        raise ValueError("consecutive_errors must be >= 1")
    return min(ERROR_BACKOFF_CAP_SECONDS, base_seconds * 2.0 ** min(consecutive_errors - 1, 62))


def describe_spec(spec: str) -> str:
    """A stored ``schedule_spec`` in words, for people: ``every 3600s`` -> ``every hour``,
    ``cron 30 2 * * * UTC`` -> ``daily at 02:30 (UTC)``; anything else as it is."""
    kind, _, rest = spec.partition(" ")
    if kind == "every":
        try:
            seconds = float(rest.removesuffix("s"))
        except ValueError:
            return spec
        for unit, size in (("day", 86_400), ("hour", 3_600), ("minute", 60)):
            if seconds >= size and seconds % size == 0:
                count = int(seconds // size)
                return f"every {unit}" if count == 1 else f"every {count} {unit}s"
        return f"every {seconds:g} seconds"
    if kind == "cron":
        fields = rest.split()
        if len(fields) != 6:
            return spec
        minute, hour, day, month, weekday, timezone = fields
        if (day, month, weekday) == ("*", "*", "*"):
            if (minute, hour) == ("*", "*"):
                return f"every minute ({timezone})"
            if minute.isdigit() and hour == "*":
                return f"hourly at minute {int(minute)} ({timezone})"
            if minute.isdigit() and hour.isdigit():
                return f"daily at {int(hour):02d}:{int(minute):02d} ({timezone})"
        return f"cron {' '.join(fields[:5])} ({timezone})"
    if kind == "continuous":
        return "continuously (the next run starts when one ends)"
    if kind == "once":
        return f"once ({rest.removeprefix('key=')})" if rest else "once per launch"
    return spec
