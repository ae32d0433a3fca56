"""The billing clock: the one source of time for renewals, grace, expiries and lapses.

Production reads the system time (``SystemClock``). With ``test_clock = true`` (refused when
``service.environment`` is ``production``) the service runs on a ``TestClock``: the system
time plus an offset that tests move forward, in process (``clock.advance``) or through
``POST /internal/billing/clock``, which also tells every other process over the shared
fan-out channel ``billing.clock`` (a process that starts later reads the offset kept in the
shared state). Moving the clock wakes the scheduler, so a month of renewals, grace and
retries runs in seconds.

Leases and callback signature tolerances use the real time: they are about processes and
transport, not about the business calendar.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Protocol

from runtime.wire import utcnow

CLOCK_CHANNEL = "billing.clock"
CLOCK_KEY = "billing.clock"


class Clock(Protocol):
    def now(self) -> datetime:
        """The current business time (UTC)."""
        ...

    def on_move(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` whenever the clock jumps (never, for the system clock)."""
        ...


class SystemClock:
    """The real time."""

    def now(self) -> datetime:
        return utcnow()

    def on_move(self, callback: Callable[[], None]) -> None:
        return None


class TestClock:
    """The real time plus an offset that only moves forward."""

    __test__ = False  # not a pytest test class

    def __init__(self) -> None:
        self.offset = timedelta(0)
        self._callbacks: list[Callable[[], None]] = []

    def now(self) -> datetime:
        return utcnow() + self.offset

    def on_move(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    def set_offset(self, offset: timedelta) -> None:
        """Use ``offset`` from now on, if it is ahead of the current one (time never goes
        back: a late fan-out message cannot undo a newer move)."""
        if offset > self.offset:
            self.offset = offset
            for callback in self._callbacks:
                callback()

    def advance(self, seconds: float) -> None:
        self.set_offset(self.offset + timedelta(seconds=seconds))
