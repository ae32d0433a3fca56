"""A Trio run on a thread of its own, for what a test module shares: the topology's fakes, a
service that several tests talk to (each test has a Trio run of its own, and pytest-trio
fixtures cannot outlive one)."""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from typing import TypeVar

import trio

T = TypeVar("T")


class Background:
    """A Trio run on a thread of its own, holding async context managers open for a test
    module; ``call_soon`` has that run call a function (to set a ``trio.Event`` of it), from
    any thread or Trio run."""

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self.token = token

    def call_soon(self, function: Callable[[], object]) -> None:
        self.token.run_sync_soon(function)


@contextmanager
def in_background(opened: Callable[[Background], AbstractAsyncContextManager[T]]
                  ) -> Iterator[T]:
    """Enter ``opened(background)`` in a Trio run on a new thread; yield what it gives;
    exit it (and end the run) at the end of the block."""
    entered: queue.Queue[tuple[T, Background] | BaseException] = queue.Queue()
    stop = trio.Event()  # set from this thread through the run's token

    async def main() -> None:
        background = Background(trio.lowlevel.current_trio_token())
        try:
            async with opened(background) as value:
                entered.put((value, background))
                await stop.wait()
        except BaseException as exc:  # given to the caller, who raises it
            entered.put(exc)

    thread = threading.Thread(target=trio.run, args=(main,), name="background-trio",
                              daemon=True)
    thread.start()
    started = entered.get(timeout=60)
    if isinstance(started, BaseException):
        raise started
    value, background = started
    try:
        yield value
    finally:
        background.call_soon(stop.set)
        thread.join(timeout=30)
