"""Draining: a process asked to stop tells everyone first, and waits for the work it holds.

On SIGTERM or SIGINT ``runtime.server`` begins the drain of the service's ``Drain`` before it
stops anything: ``/readyz`` answers 503 ``draining`` (a load balancer takes the process out),
every connection closes after its current request, and plugins react through this object,
never through an import of each other:

- ``Drain.began`` is set: work that must not start any more checks ``draining`` (the
  projects queue refuses new runs);
- ``Drain.on_begin(callback)`` calls ``callback`` when the drain begins (the SSE streams
  end there, with a reconnect hint);
- ``Drain.hold()`` marks work the drain waits for (a run in progress): the server waits
  until no hold is left, or ``service.drain_seconds`` passed, before it stops accepting
  connections and stops the actors (which end what is still running).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import trio


class Drain:
    """The drain of one service process (``Service.drain``)."""

    def __init__(self) -> None:
        self.began = trio.Event()
        self._callbacks: list[Callable[[], None]] = []
        self._holds = 0
        self._released = trio.Event()
        self._released.set()

    @property
    def draining(self) -> bool:
        return self.began.is_set()

    def begin(self) -> None:
        """Begin the drain (once; later calls do nothing): call every ``on_begin`` callback."""
        if self.began.is_set():
            return
        self.began.set()
        for callback in self._callbacks:
            callback()

    def on_begin(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` when the drain begins (at once, when it has). It must not block:
        it runs in the task that begins the drain."""
        if self.draining:
            callback()
        else:
            self._callbacks.append(callback)

    @contextmanager
    def hold(self) -> Iterator[None]:
        """Work the drain waits for while it runs (``wait_released``)."""
        self._holds += 1
        if self._holds == 1:
            self._released = trio.Event()
        try:
            yield
        finally:
            self._holds -= 1
            if not self._holds:
                self._released.set()

    async def wait_released(self) -> None:
        """Return once no ``hold`` is held."""
        while self._holds:
            await self._released.wait()
