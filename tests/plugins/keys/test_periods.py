"""Spend period boundaries: UTC day, ISO week from Monday, calendar month, forever."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta, timezone

from plugins.keys.periods import epoch_of, period_key, period_reset, period_start, since_time

NOON = datetime(2026, 12, 31, 12, 0, tzinfo=UTC)  # a Thursday


def test_boundaries_are_utc_calendar_ones() -> None:
    assert period_start("day", NOON) == date(2026, 12, 31)
    assert period_reset("day", NOON) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_start("week", NOON) == date(2026, 12, 28)
    assert period_reset("week", NOON) == datetime(2027, 1, 4, tzinfo=UTC)
    assert period_start("month", NOON) == date(2026, 12, 1)
    assert period_reset("month", NOON) == datetime(2027, 1, 1, tzinfo=UTC)
    assert period_reset("month", datetime(2027, 2, 10, tzinfo=UTC)) == \
        datetime(2027, 3, 1, tzinfo=UTC)
    assert period_start("forever", NOON) is None and period_reset("forever", NOON) is None


def test_a_local_time_is_placed_in_its_utc_period() -> None:
    # 2027-01-01 01:00 at UTC+2 is still 2026-12-31 in UTC.
    local = datetime(2027, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=2)))
    assert period_start("day", local) == date(2026, 12, 31)


def test_period_keys_only_grow() -> None:
    day = period_key(0, "day", NOON)
    assert period_key(0, "day", NOON + timedelta(days=1)) > day
    assert period_key(1, "forever", NOON) > period_key(0, "month", NOON)
    assert epoch_of(period_key(7, "week", NOON)) == 7
    assert period_key(0, "forever", NOON) == 0


def test_usage_windows_start_at_period_starts() -> None:
    assert since_time("month", NOON) == datetime(2026, 12, 1, tzinfo=UTC)
    assert since_time("all", NOON) is None
