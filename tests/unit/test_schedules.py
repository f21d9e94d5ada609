from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from agora_pg.errors import InvalidSchedule
from agora_pg.schedules import NextRun, Schedule, ScheduleKind, error_backoff, next_cron_tick

BERLIN = ZoneInfo("Europe/Berlin")
T0 = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)


def berlin(*args: int, fold: int = 0) -> datetime:
    return datetime(*args, tzinfo=BERLIN, fold=fold).astimezone(UTC)


def after(schedule: Schedule, finished_at: datetime, tick: datetime = T0 - timedelta(days=365)) -> datetime | None:
    """The next run time after a success that ended at ``finished_at`` (the tick long past)."""
    return schedule.next_run_after_success(finished_at, tick).at_time(finished_at)


def test_every_adds_the_interval_to_the_finish_time() -> None:
    schedule = Schedule.every(hours=1, minutes=30, seconds=5)
    assert schedule.interval_seconds == 5405
    assert schedule.first_run_at(T0) is None  # a new schedule runs at once (now by the database clock)
    finished = T0 + timedelta(minutes=45)  # a 45-minute run
    assert schedule.next_run_after_success(finished, T0) == NextRun(in_seconds=5405)  # by the database clock
    assert after(schedule, finished) == T0 + timedelta(hours=2, minutes=15, seconds=5)
    assert after(Schedule.every(days=1), T0) == T0 + timedelta(days=1)
    assert Schedule.every(seconds=0.5).spec == "every 0.5s"


@pytest.mark.parametrize("kwargs", [{}, {"seconds": 0}, {"minutes": -1}, {"hours": "1"}, {"seconds": True}])
def test_every_rejects_non_positive_or_non_numbers(kwargs: dict) -> None:
    with pytest.raises(InvalidSchedule):
        Schedule.every(**kwargs)


def test_continuous_and_once() -> None:
    assert after(Schedule.continuous(), T0) == T0
    assert Schedule.once().first_run_at(T0) is None
    assert Schedule.once().next_run_after_success(T0, T0) == NextRun()
    assert after(Schedule.once(), T0) is None
    assert (Schedule.continuous().spec, Schedule.once().spec) == ("continuous", "once")


def test_cron_every_six_hours_in_utc() -> None:
    schedule = Schedule.cron("0 */6 * * *")
    assert schedule.kind is ScheduleKind.CRON and schedule.spec == "cron 0 */6 * * * UTC"
    assert schedule.first_run_at(T0) == datetime(2026, 6, 1, 18, 0, tzinfo=UTC)
    assert after(schedule, datetime(2026, 6, 1, 18, 0, 3, tzinfo=UTC)) == datetime(2026, 6, 2, 0, 0, tzinfo=UTC)


def test_cron_next_tick_is_after_the_tick_even_if_the_run_ends_before_it_by_some_clock() -> None:
    # a host 20 ms behind the database: the 3 ms run "ends" before its own tick
    schedule = Schedule.cron("0 * * * *")
    tick = datetime(2026, 6, 1, 13, 0, tzinfo=UTC)
    finished_by_a_slow_clock = tick - timedelta(milliseconds=17)
    assert schedule.next_run_after_success(finished_by_a_slow_clock, tick) == NextRun(
        at=datetime(2026, 6, 1, 14, 0, tzinfo=UTC)
    )


def test_cron_missed_ticks_are_not_replayed() -> None:
    # a run that finishes three days late is followed by the next tick, not by the missed ones
    schedule = Schedule.cron("0 2 * * *")
    assert after(schedule, datetime(2026, 6, 4, 9, 0, tzinfo=UTC)) == datetime(2026, 6, 5, 2, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("expression", "timezone", "message"),
    [
        ("61 * * * *", "UTC", r"the minute field '61' is not valid: it takes 0-59"),
        ("0 25 * * *", "UTC", r"the hour field '25' is not valid: it takes 0-23"),
        ("0 0 32 * *", "UTC", r"the day of month field '32' is not valid: it takes 1-31"),
        ("0 0 * 13 *", "UTC", r"the month field '13' is not valid: it takes 1-12 or JAN-DEC"),
        ("0 0 * * 9", "UTC", r"the day of week field '9' is not valid: it takes 0-6 or SUN-SAT"),
        ("*/0 * * * *", "UTC", r"the minute field '\*/0' is not valid"),
        ("* * *", "UTC", r"expected 5 fields \(minute hour day-of-month month day-of-week\).*got 3"),
        ("0 0 * * * *", "UTC", r"expected 5 fields .*got 6"),
        ("every hour", "UTC", r"expected 5 fields .*got 2"),
        ("0 * * * *", "Mars/Olympus", "unknown time zone"),
    ],
)
def test_invalid_cron_fails_at_construction(expression: str, timezone: str, message: str) -> None:
    with pytest.raises(InvalidSchedule, match=message):
        Schedule.cron(expression, timezone=timezone)


def test_daily_cron_keeps_wall_clock_time_across_both_dst_changes() -> None:
    schedule = Schedule.cron("0 9 * * *", timezone="Europe/Berlin")
    # spring: 9:00 CET is 08:00 UTC, 9:00 CEST is 07:00 UTC
    assert after(schedule, berlin(2026, 3, 28, 10, 0)) == berlin(2026, 3, 29, 9, 0)
    assert berlin(2026, 3, 29, 9, 0) == datetime(2026, 3, 29, 7, 0, tzinfo=UTC)
    # autumn: back to 08:00 UTC
    assert after(schedule, berlin(2026, 10, 24, 10, 0)) == datetime(2026, 10, 25, 8, 0, tzinfo=UTC)


def test_skipped_wall_clock_time_runs_after_the_spring_forward_gap() -> None:
    # 2026-03-29 02:00 CET jumps to 03:00 CEST: 02:30 does not exist that night
    tick = next_cron_tick("30 2 * * *", "Europe/Berlin", berlin(2026, 3, 28, 12, 0))
    assert tick == berlin(2026, 3, 29, 3, 30) == datetime(2026, 3, 29, 1, 30, tzinfo=UTC)
    assert next_cron_tick("30 2 * * *", "Europe/Berlin", tick) == berlin(2026, 3, 30, 2, 30)


def test_hourly_cron_across_spring_forward_has_no_duplicate_or_gap() -> None:
    ticks, at = [], berlin(2026, 3, 29, 0, 0)
    for _ in range(4):
        at = next_cron_tick("0 * * * *", "Europe/Berlin", at)
        ticks.append(at)
    # 01:00 CET, then 03:00 CEST (02:00 does not exist), 04:00 CEST, 05:00 CEST: one per real hour
    assert ticks == [datetime(2026, 3, 29, h, 0, tzinfo=UTC) for h in (0, 1, 2, 3)]


def test_repeated_wall_clock_time_runs_once_at_fall_back() -> None:
    # 2026-10-25 03:00 CEST falls back to 02:00 CET: 02:30 happens twice
    first = next_cron_tick("30 2 * * *", "Europe/Berlin", berlin(2026, 10, 24, 12, 0))
    assert first == berlin(2026, 10, 25, 2, 30, fold=0) == datetime(2026, 10, 25, 0, 30, tzinfo=UTC)
    # after the first 02:30 (or during the repeated hour), the next run is the next day
    assert next_cron_tick("30 2 * * *", "Europe/Berlin", first) == berlin(2026, 10, 26, 2, 30)
    during_repeat = berlin(2026, 10, 25, 2, 10, fold=1)
    assert next_cron_tick("30 2 * * *", "Europe/Berlin", during_repeat) == berlin(2026, 10, 26, 2, 30)


def test_next_cron_tick_needs_an_aware_time() -> None:
    with pytest.raises(ValueError):
        next_cron_tick("* * * * *", "UTC", datetime(2026, 1, 1))


@pytest.mark.parametrize(("errors", "seconds"), [(1, 60), (2, 120), (3, 240), (4, 480), (5, 600), (30, 600)])
def test_error_backoff_doubles_from_the_base_up_to_ten_minutes(errors: int, seconds: float) -> None:
    assert error_backoff(errors, 60.0) == seconds


def test_error_backoff_with_a_small_base() -> None:
    assert [error_backoff(n, 30.0) for n in (1, 2, 3, 4, 5, 6)] == [30, 60, 120, 240, 480, 600]
    with pytest.raises(ValueError):
        error_backoff(0, 60.0)


def test_once_runs_per_launch_unless_it_has_a_key() -> None:
    assert Schedule.once().once_per_launch and Schedule.once().spec == "once"
    keyed = Schedule.once(key="backfill-2024")
    assert not keyed.once_per_launch and keyed.spec == "once key=backfill-2024"
    assert keyed.next_run_after_success(T0, T0) == NextRun()
    for bad in ("", "  ", "a\nb", "x" * 201, 7):
        with pytest.raises(InvalidSchedule, match="Schedule.once\\(key="):
            Schedule.once(key=bad)  # type: ignore[arg-type]
