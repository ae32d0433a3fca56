"""Spend periods: UTC calendar day, ISO week (from Monday), calendar month, or forever.

A period is identified by an integer *period key*, ``epoch * 10^8 + YYYYMMDD`` of the
period's first day (``0`` for ``forever``), so that period keys of one key only grow: a
new day, week or month has a larger date, and changing ``spend_period`` bumps the epoch.
Meters and the database use it to tell the current period from an older one without a
clock of their own.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from functools import lru_cache
from typing import Literal

from runtime.wire import iso

SpendPeriod = Literal["day", "week", "month", "forever"]
SPEND_PERIODS: tuple[SpendPeriod, ...] = ("day", "week", "month", "forever")
UsageSince = Literal["day", "week", "month", "all"]
_EPOCH_FACTOR = 100_000_000
# ``forever`` never resets; its reset header is the largest ISO timestamp, so clients that
# compare times need no special case.
NEVER = "9999-12-31T23:59:59.999Z"


def period_start(period: SpendPeriod | UsageSince, now: datetime) -> date | None:
    """The first UTC day of the period holding ``now``; None for ``forever`` and ``all``."""
    today = now.astimezone(UTC).date()
    if period == "day":
        return today
    if period == "week":
        return today - timedelta(days=today.weekday())
    if period == "month":
        return today.replace(day=1)
    return None


def period_reset(period: SpendPeriod, now: datetime) -> datetime | None:
    """When the period holding ``now`` ends (UTC midnight); None for ``forever``."""
    start = period_start(period, now)
    if start is None:
        return None
    if period == "day":
        end = start + timedelta(days=1)
    elif period == "week":
        end = start + timedelta(days=7)
    else:
        end = (start.replace(day=28) + timedelta(days=4)).replace(day=1)
    return datetime(end.year, end.month, end.day, tzinfo=UTC)


def since_time(since: UsageSince, now: datetime) -> datetime | None:
    """The start of a usage window (``GET .../usage?since=``); None for ``all``."""
    start = period_start(since, now)
    return None if start is None else datetime(start.year, start.month, start.day, tzinfo=UTC)


def period_key(epoch: int, period: SpendPeriod, now: datetime) -> int:
    """The key of the period holding ``now`` for a key at ``epoch``."""
    start = period_start(period, now)
    day_number = 0 if start is None else start.year * 10_000 + start.month * 100 + start.day
    return epoch * _EPOCH_FACTOR + day_number


def epoch_of(key: int) -> int:
    """The epoch a period key belongs to."""
    return key // _EPOCH_FACTOR


# The request path asks these for every key request; they change once a day at most.
_DAY_SECONDS = 86_400


@lru_cache(maxsize=64)
def _start_number(period: SpendPeriod, day: int) -> int:
    start = period_start(period, datetime.fromtimestamp(day * _DAY_SECONDS, UTC))
    return 0 if start is None else start.year * 10_000 + start.month * 100 + start.day


@lru_cache(maxsize=64)
def _reset_text(period: SpendPeriod, day: int) -> str:
    reset = period_reset(period, datetime.fromtimestamp(day * _DAY_SECONDS, UTC))
    return NEVER if reset is None else iso(reset)


def period_key_at(epoch: int, period: SpendPeriod, unix: float) -> int:
    """``period_key`` for a Unix time, cached per UTC day."""
    return epoch * _EPOCH_FACTOR + _start_number(period, int(unix // _DAY_SECONDS))


def reset_text_at(period: SpendPeriod, unix: float) -> str:
    """The ISO end of the period holding ``unix`` (``NEVER`` for forever), cached per day."""
    return _reset_text(period, int(unix // _DAY_SECONDS))
