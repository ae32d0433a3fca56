"""Waiting out a dependency outage: capped, jittered exponential backoff.

An actor that meets an outage (``runtime.errors.is_outage``) keeps what it was doing (a
batch of rows, a queued event, a charge not yet recorded) and tries again after a delay
that starts at ``initial`` seconds and doubles up to ``maximum``; each delay is drawn at
random from its upper half ("equal jitter"), so that the processes of a deployment do not
all hit a database coming back at the same instant. The cap keeps recovery fast: once the
dependency answers again, an actor notices within ``maximum`` seconds (5 by default).
Anything that is not an outage propagates at once: it is a bug, for the supervisor.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import trio

from runtime.errors import is_outage

T = TypeVar("T")
INITIAL_SECONDS = 0.1
MAXIMUM_SECONDS = 5.0


class Backoff:
    """The delays of one retry loop.

    :param initial: the first delay's upper bound, in seconds.
    :param maximum: the cap of every delay, in seconds.
    """

    def __init__(self, initial: float = INITIAL_SECONDS, maximum: float = MAXIMUM_SECONDS) -> None:
        self._initial = initial
        self._maximum = maximum
        self._ceiling = initial

    def reset(self) -> None:
        """Start over from ``initial`` (call it after a success)."""
        self._ceiling = self._initial

    def next_delay(self) -> float:
        """The next delay: random in the upper half of the current ceiling, which doubles."""
        ceiling = self._ceiling
        self._ceiling = min(ceiling * 2, self._maximum)
        return random.uniform(ceiling / 2, ceiling)


def outage_cause(error: BaseException) -> str:
    """A short description of an outage for a log line (no traceback: it is not a bug)."""
    if isinstance(error, BaseExceptionGroup) and error.exceptions:
        return outage_cause(error.exceptions[0])
    message = getattr(error, "message", None) or str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


async def until_available(operation: Callable[[], Awaitable[T]], *, what: str,
                          log: logging.Logger, backoff: Backoff | None = None) -> T:
    """Await ``operation()`` until it does not fail with an outage; its result.

    Each outage is logged as one warning line naming ``what`` was tried, then waited out
    with ``backoff`` (a fresh ``Backoff()`` by default). ``operation`` must be safe to
    repeat after an outage: either it did not happen, or doing it again changes nothing.

    :raises: whatever ``operation`` raises that is not an outage.
    """
    backoff = backoff or Backoff()
    while True:
        try:
            return await operation()
        except Exception as exc:
            if not is_outage(exc):
                raise
            delay = backoff.next_delay()
            log.warning("%s failed (%s); retrying in %.1f s", what, outage_cause(exc), delay)
            await trio.sleep(delay)
