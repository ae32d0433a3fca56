"""The process's budget of bytes queued to stream readers, and the cut of the most behind.

A reader's backlog is a list of the ring's shared frames (``live.ring``): it costs nothing
per reader. What does cost memory per reader is a write in progress: hypercorn frames each
piece of a response body into a new buffer (HTTP/1.1 chunked framing) and holds it until
the kernel has taken all of it, which a reader that stopped reading never lets happen. So
every write of a reader's task goes through :class:`QueuedBytes`: it is at most
``WRITE_BYTES`` (or one frame) and counts until it finishes. The ring's writes for its
caught-up readers (the fast path, ``Ring.wake``) hold nothing: what the kernel does not take
at once goes back to the reader's task, and counts from then on. A write that would take
the process past its budget waits until others finish, and while some wait,
:meth:`QueuedBytes.over_budget` picks readers that have been writing or waiting for
``GRACE_SECONDS``, the most bytes behind first (never one while a reader further behind is
still within its grace), for the hub to cut off by a reset of their connections, as the
broadcaster cuts readers stuck past their lag or timeout. A reader cut off resumes with
``Last-Event-ID``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import trio
from prometheus_client import CollectorRegistry, Counter, Gauge

from plugins.projects.live.ring import WRITE_BYTES, Lagged, Subscription
from plugins.projects.settings import ProjectsSettings
from runtime.service import Service, StateSlot

log = logging.getLogger("flowsvc.projects.stream")
GRACE_SECONDS = 1.0
"""How long a reader must have been writing, or waiting to write, before the budget may
cut it off: a burst of writes that all finish at once cuts nobody."""


def pieces(frames: list[bytes], limit: int = WRITE_BYTES) -> Iterator[bytes]:
    """``frames`` as consecutive writes of at most ``limit`` bytes; a frame of ``limit``
    bytes or more is one write by itself, the shared object unjoined."""
    start, size = 0, 0
    for index, frame in enumerate(frames):
        if size and size + len(frame) > limit:
            yield _joined(frames[start:index])
            start, size = index, 0
        size += len(frame)
    if start < len(frames):
        yield _joined(frames[start:])


def _joined(frames: list[bytes]) -> bytes:
    return frames[0] if len(frames) == 1 else b"".join(frames)


class QueuedBytes:
    """The bytes of the writes in progress to this process's readers, within ``budget``,
    and the Prometheus collectors ``flowsvc_sse_queued_bytes``,
    ``flowsvc_sse_readers_cut_total`` and those of the fast path (``Ring.wake``),
    ``flowsvc_sse_fast_writes_total`` and ``flowsvc_sse_fast_path_left_total`` (on
    ``registry``; made once per service)."""

    def __init__(self, budget: int, registry: CollectorRegistry) -> None:
        self.budget = budget
        self.total = 0
        self.writing: set[Subscription] = set()
        self.waiting: dict[Subscription, tuple[int, float]] = {}
        """The readers waiting for room: the size of their write, and since when."""
        self._room = trio.Event()
        Gauge("flowsvc_sse_queued_bytes", "Bytes of stream writes in progress in this process",
              registry=registry).set_function(lambda: self.total)
        self.cut = Counter("flowsvc_sse_readers_cut", "Stream readers cut off, by reason "
                           "(lag, write_timeout, queued_bytes)", ["reason"], registry=registry)
        self.fast_writes = Counter("flowsvc_sse_fast_writes", "Stream writes made by a "
                                   "broadcaster for its caught-up readers (the fast path)",
                                   registry=registry)
        self.fast_path_left = Counter("flowsvc_sse_fast_path_left", "Readers handed back from "
                                      "the fast path to their own task, by reason "
                                      "(would_block, backlog, gone)", ["reason"],
                                      registry=registry)

    @classmethod
    def create(cls, service: Service) -> QueuedBytes:
        settings = service.plugin_settings("projects", ProjectsSettings)
        return cls(settings.subscriber_queued_bytes, service.metrics.registry)

    async def acquire(self, reader: Subscription, size: int) -> None:
        """Count a write of ``size`` bytes by ``reader``, once the budget has room for it
        (at once when nothing else is being written, however large it is), and start the
        write's clock (``reader.writing_since``: the broadcaster's write timeout, ``Ring.stuck``,
        and the budget's grace count from there).

        :raises Lagged: the reader was cut off while it waited.
        """
        since = trio.current_time()
        while self.total and self.total + size > self.budget and reader.dropped is None:
            room = self._room
            self.waiting[reader] = (size, since)
            try:
                await room.wait()
            finally:
                del self.waiting[reader]
        if reader.dropped is not None:
            raise Lagged(reader.dropped)
        self.total += size
        reader.queued = size
        reader.writing_since = trio.current_time()
        self.writing.add(reader)

    def release(self, reader: Subscription) -> None:
        """``reader``'s write is over (written, failed or abandoned); no-op without one."""
        reader.writing_since = None
        if not reader.queued:
            return
        self.total -= reader.queued
        reader.queued = 0
        self.writing.discard(reader)
        if self.waiting:
            self._wake()

    def _wake(self) -> None:
        self._room.set()
        self._room = trio.Event()

    def over_budget(self, now: float) -> list[Subscription]:
        """The readers to cut off so the rest fit in the budget, once writes wait for room.

        The readers writing or waiting to write are taken the most bytes behind first, and
        cut off while the total is over the budget; the walk stops at the first one that
        has not been writing, or waiting, for ``GRACE_SECONDS`` (a burst may end by
        itself), so a reader is never cut while one further behind is part of the excess.
        Each is marked ``dropped`` and returned once; a waiting one is woken (its task
        ends).
        """
        if not self.waiting:
            return []
        holding = {reader: reader.queued for reader in self.writing if reader.dropped is None}
        wanting = {reader: size for reader, (size, _) in self.waiting.items()
                   if reader.dropped is None}
        excess = sum(holding.values()) + sum(wanting.values()) - self.budget
        victims = []
        for reader in sorted(holding.keys() | wanting.keys(), key=Subscription.bytes_behind,
                             reverse=True):
            if excess <= 0 or now - self._busy_since(reader) < GRACE_SECONDS:
                break
            reader.dropped = f"the process's readers hold {self.budget} bytes of writes"
            excess -= holding.get(reader, 0) + wanting.get(reader, 0)
            victims.append(reader)
        if any(reader in wanting for reader in victims):
            self._wake()
        return victims

    def _busy_since(self, reader: Subscription) -> float:
        """Since when ``reader`` has been waiting for room, or else writing."""
        if reader in self.waiting:
            return self.waiting[reader][1]
        assert reader.writing_since is not None  # from acquire to release
        return reader.writing_since

    def count_fast_path(self, written: int, left: list[str]) -> None:
        """Count what a ring's fast path did (``Ring.wake``'s answer)."""
        if written:
            self.fast_writes.inc(written)
        for reason in left:
            self.fast_path_left.labels(reason=reason).inc()

    def cut_off(self, readers: list[Subscription], reason: str, where: str) -> None:
        """Reset the connections of ``readers`` (marked ``dropped`` already), counted in
        ``flowsvc_sse_readers_cut_total`` under ``reason``."""
        if not readers:
            return
        self.cut.labels(reason=reason).inc(len(readers))
        # A reader between writes may have its socket full too: it is reset as well. A write
        # blocked on a reset connection fails, and the request ends as for any disconnect.
        for reader in readers:
            if reader.connection is not None:
                reader.connection.reset()
        log.info("cut off %d readers of %s (%s)", len(readers), where, readers[0].dropped)


QUEUED_BYTES: StateSlot[QueuedBytes] = StateSlot("projects.queued_bytes", QueuedBytes.create)
