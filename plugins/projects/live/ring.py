"""The ring of one stream: its newest events as SSE frames, and the readers' cursors into it.

The ring keeps the newest ``capacity`` events of a stream as ready-made SSE frames, so an
event is encoded once however many clients read it. Readers do not get a queue each: a
:class:`Subscription` is a cursor into the shared ring (the tractor ``broadcast`` design),
woken when the ring grows, and it takes every frame it has not sent yet at once, as a list
of the ring's own ``bytes`` objects (never joined or copied: a reader's backlog costs a
pointer per event), so a reader that fell behind catches up in one go. A reader that is
caught up and writes straight to its connection (``runtime.direct_write``) parks on the ring
instead of waiting to be woken (:meth:`Subscription.park`): after a publish, the ring writes
the new frames to every parked reader itself, from the broadcaster's task, without blocking
(:meth:`Ring.wake`, the fast path), and hands a reader back to its own task only when that
write does not go through whole or the reader has more to do. The publisher never waits for
readers. A reader more than ``max_lag`` events behind the live head (its
initial replay not counted), or whose cursor fell out of the ring, gets :class:`Lagged`
and is disconnected; it resumes with ``Last-Event-ID``. That check runs when the reader takes
frames, which a reader stuck in a write never does: the broadcaster sweeps the ring for
them (:meth:`Ring.stuck`) and resets their connections. The stream's broadcaster actor owns
the ring (``live.broadcaster``).
"""

from __future__ import annotations

from collections import Counter

import trio

from plugins.projects.live.event_log import StreamEvent
from runtime.connections import ClientConnection
from runtime.direct_write import DirectWriter, chunk

NO_EARLIER_EVENT = "-1"
WRITE_BYTES = 128 * 1024
"""The most a write joins: larger backlogs go out in several writes (``live.queued.pieces``,
by the readers' own tasks), a larger frame alone."""


class Lagged(Exception):
    """Raised to a reader that fell too far behind; it must reconnect with Last-Event-ID."""


class Ring:
    """The newest ``capacity`` events of one stream, as SSE frames, numbered ``first_seq``
    to ``last_seq`` (empty when ``last_seq < first_seq``)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._frames: list[bytes] = [b""] * capacity
        self._runs: list[str] = [""] * capacity
        self.first_seq = 1
        self.last_seq = 0
        self.changed = trio.Event()
        self.closed = False
        self.subscriptions: set[Subscription] = set()
        self.parked: dict[Subscription, DirectWriter] = {}
        """The readers on the fast path: caught up, waiting for the ring to write for them."""
        self._heartbeats: Counter[float] = Counter()
        self.touched = trio.current_time()

    @property
    def readers(self) -> int:
        return len(self.subscriptions)

    def join(self, subscription: Subscription) -> None:
        self.subscriptions.add(subscription)
        self._heartbeats[subscription.heartbeat_seconds] += 1

    def leave(self, subscription: Subscription) -> None:
        self.subscriptions.discard(subscription)
        self._heartbeats[subscription.heartbeat_seconds] -= 1
        if not self._heartbeats[subscription.heartbeat_seconds]:
            del self._heartbeats[subscription.heartbeat_seconds]
        self.touched = trio.current_time()

    def heartbeat_seconds(self, default: float) -> float:
        """How often the ring must beat for its most demanding reader (``default`` when
        it has none)."""
        return min(self._heartbeats, default=default)

    def stuck(self, now: float, write_timeout: float) -> dict[str, list[Subscription]]:
        """The readers whose current write has lasted ``write_timeout`` seconds or more
        (under ``write_timeout``), or that fell more than their ``max_lag`` behind while
        writing (under ``lag``); each is marked ``dropped`` (with the reason) and returned
        once."""
        found: dict[str, list[Subscription]] = {}
        for subscription in self.subscriptions:
            started = subscription.writing_since
            if started is None or subscription.dropped is not None:
                continue
            if now - started >= write_timeout:
                subscription.dropped = f"a write took more than {write_timeout:g} s"
                found.setdefault("write_timeout", []).append(subscription)
            elif subscription.behind() > subscription.max_lag:
                subscription.dropped = f"more than {subscription.max_lag} events behind"
                found.setdefault("lag", []).append(subscription)
        return found

    def reset(self, events: list[StreamEvent], last_seq: int) -> None:
        """Hold ``events`` (the newest ones, in order) of a stream whose last is ``last_seq``."""
        start = events[0].seq - 1 if events else last_seq
        self.first_seq, self.last_seq = start + 1, start
        for event in events:
            self.append(event)

    def append(self, event: StreamEvent) -> None:
        """Add the event numbered ``last_seq + 1``; the oldest one drops out when full."""
        assert event.seq == self.last_seq + 1, (event.seq, self.last_seq)
        slot = event.seq % self.capacity
        self._frames[slot] = event.frame()
        self._runs[slot] = event.run_id
        self.last_seq = event.seq
        if self.last_seq - self.first_seq + 1 > self.capacity:
            self.first_seq = self.last_seq - self.capacity + 1

    def wake(self) -> tuple[int, list[str]]:
        """After appends: write the new frames to the parked readers, wake the others.

        This is the fast path: the broadcaster's one task writes each parked reader's new
        frames (one chunk, framed once for all the readers at the same cursor) with a
        non-blocking write on its connection, so a publish costs a parked reader no task
        wake-up, only its system call. A reader whose write does not go through whole
        (its socket is full, or another write holds the connection), whose batch is too
        large or too far ahead (``WRITE_BYTES``, its ``max_lag``), or whose connection
        failed, is handed back to its own task (``Subscription.park`` returns), which
        finishes the chunk, catches up and parks again.

        :return: how many writes went out whole, and why each reader handed back left
            (``would_block``, ``backlog`` or ``gone``).
        """
        self.touched = trio.current_time()
        written, left = self._deliver() if self.parked else (0, [])
        self._notify()
        return written, left

    def _deliver(self) -> tuple[int, list[str]]:
        last = self.last_seq
        now = self.touched
        chunks: dict[int, bytes] = {}  # by cursor: b"" when the readers' tasks must take it
        written = 0
        leaving: list[tuple[Subscription, str]] = []
        for reader, writer in self.parked.items():
            cursor = reader.cursor
            if cursor == last:  # parked since the last append
                continue
            data = chunks.get(cursor)
            if data is None:
                data = chunks[cursor] = self._fast_chunk(cursor)
            if not data or last - cursor > reader.max_lag:
                leaving.append((reader, "backlog"))
                continue
            try:
                sent = writer.write_now(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                reader.gone = True
                leaving.append((reader, "gone"))
                continue
            reader.cursor = last
            reader.last_write = now
            if sent == len(data):
                written += 1
            else:
                reader.rest = memoryview(data)[sent:]
                leaving.append((reader, "would_block"))
        for reader, _ in leaving:
            self._unpark(reader)
        return written, [reason for _, reason in leaving]

    def _fast_chunk(self, cursor: int) -> bytes:
        """The frames after ``cursor`` as one chunk; b"" when they are not the fast path's
        (too many bytes, or no longer all held)."""
        if cursor < self.first_seq - 1:
            return b""
        data = b"".join(self.frames_after(cursor))
        return chunk(data) if len(data) <= WRITE_BYTES else b""

    def _unpark(self, reader: Subscription) -> None:
        del self.parked[reader]
        reader.resumed.set()

    def beat(self) -> None:
        """Wake every waiting reader without news: the ones idle too long send a heartbeat;
        hand back to their tasks the parked readers due one, cut off, or of a closed ring.

        Heartbeats ride on these wake-ups instead of a timer per reader, so waiting for the
        next event costs a reader no cancel scope and no deadline.
        """
        now = trio.current_time()
        for reader in [reader for reader in self.parked
                       if self.closed or reader.dropped is not None
                       or now - reader.last_write >= reader.heartbeat_seconds]:
            self._unpark(reader)
        self._notify()

    def _notify(self) -> None:
        changed, self.changed = self.changed, trio.Event()
        changed.set()

    def close(self) -> None:
        self.closed = True
        self.beat()

    def frames_after(self, cursor: int) -> list[bytes]:
        """Every frame after ``cursor``: the ring's own objects, shared by every reader.

        :raises Lagged: events after ``cursor`` already dropped out of the ring.
        """
        if cursor < self.first_seq - 1:
            raise Lagged(f"events after {cursor} are no longer held")
        frames = self._frames
        capacity = self.capacity
        return [frames[seq % capacity] for seq in range(cursor + 1, self.last_seq + 1)]

    def bytes_after(self, cursor: int) -> int:
        """The size of the frames after ``cursor`` (of the whole ring when some of them
        already dropped out)."""
        frames = self._frames
        capacity = self.capacity
        return sum(len(frames[seq % capacity])
                   for seq in range(max(cursor, self.first_seq - 1) + 1, self.last_seq + 1))

    def run_start(self, run_id: str | None) -> int:
        """The cursor just before the first held event of run ``run_id`` (for a reader
        without ``Last-Event-ID``); the live head when that run has published nothing yet."""
        if run_id is None or self.last_seq < self.first_seq or \
                self._runs[self.last_seq % self.capacity] != run_id:
            return self.last_seq
        seq = self.last_seq
        while seq > self.first_seq and self._runs[(seq - 1) % self.capacity] == run_id:
            seq -= 1
        return seq - 1

    def start_cursor(self, last_event_id: str | None, run_id: str | None
                     ) -> tuple[int, str | None]:
        """Where a reader starts, and the ``Last-Event-ID`` response header when events
        were lost (Mercure's signal: the id before the first event sent, ``-1`` if none).

        No ``Last-Event-ID``: the start of run ``run_id`` (the stream's latest run), or
        the live head. A known id: just after it. An id older than the ring, or unknown:
        the whole ring, with the header.
        """
        if last_event_id is None:
            return self.run_start(run_id), None
        try:
            requested = int(last_event_id.strip())
        except ValueError:
            requested = -2
        if self.first_seq - 1 <= requested <= self.last_seq:
            return requested, None
        cursor = self.first_seq - 1
        return cursor, str(cursor) if cursor > 0 else NO_EARLIER_EVENT


class Subscription:
    """A reader's cursor into a ring. Use it as a context manager while reading.

    :param heartbeat_seconds: how long the reader may stay silent (its ring beats at least
        this often while it reads).
    """

    def __init__(self, ring: Ring, cursor: int, max_lag: int, heartbeat_seconds: float) -> None:
        self.ring = ring
        self.cursor = cursor
        self.max_lag = max_lag
        self.heartbeat_seconds = heartbeat_seconds
        self._replay_until = ring.last_seq
        self.writing_since: float | None = None
        """When the reader's current write began; None between writes (set by
        ``QueuedBytes.acquire``, cleared by its ``release``)."""
        self.dropped: str | None = None
        """Why the reader was cut off (by its broadcaster, or the process's budget of queued
        bytes), once it has been."""
        self.connection: ClientConnection | None = None
        """The reader's connection, for the broadcaster or the budget to reset."""
        self.unsent = 0
        """Bytes of the frames taken and not written yet (its writer counts them)."""
        self.queued = 0
        """Bytes of the write in progress, as counted by ``live.queued.QueuedBytes``."""
        self.last_write = trio.current_time()
        """When the reader last wrote (its task, or the ring for it): its heartbeats count
        from there."""
        self.resumed = trio.Event()
        """Set when the ring hands a parked reader back to its task."""
        self.rest: bytes | memoryview = b""
        """The end of a chunk the ring began and could not finish: its task writes it first."""
        self.gone = False
        """The ring's write failed: the connection is gone."""

    def __enter__(self) -> Subscription:
        self.ring.join(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.ring.leave(self)

    @property
    def closed(self) -> bool:
        return self.ring.closed

    def take(self) -> list[bytes]:
        """Every frame not sent yet, the ring's own objects (empty when up to date).

        :raises Lagged: the reader is more than ``max_lag`` events behind the live head,
            or its next event is no longer held.
        """
        if self.dropped is not None:
            raise Lagged(self.dropped)
        ring = self.ring
        last = ring.last_seq
        if self.cursor >= last:
            return []
        if self.behind() > self.max_lag:
            raise Lagged(f"more than {self.max_lag} events behind")
        frames = ring.frames_after(self.cursor)
        self.cursor = last
        return frames

    def behind(self) -> int:
        """How many live events the reader has not taken (its initial replay not counted)."""
        return self.ring.last_seq - max(self.cursor, self._replay_until)

    def bytes_behind(self) -> int:
        """How many bytes the reader has yet to write: taken, and still in the ring."""
        return self.unsent + self.ring.bytes_after(self.cursor)

    async def park(self, writer: DirectWriter) -> None:
        """Leave the reader's writes to the ring (``Ring.wake``, the fast path) until it hands
        them back; the reader must be caught up, and ``writer`` its response's. On return,
        ``rest`` (what must be written first) and ``gone`` say how the ring left it."""
        self.resumed = trio.Event()
        self.ring.parked[self] = writer
        try:
            await self.resumed.wait()
        finally:
            self.ring.parked.pop(self, None)

    async def wait(self) -> None:
        """Return once the ring holds events after the cursor, is closed, or beats."""
        changed = self.ring.changed
        if self.ring.last_seq > self.cursor or self.ring.closed:
            return
        await changed.wait()
