"""The broadcaster: one actor per streamed project, owning the stream's ring.

The actor loads the ring (``live.ring``) from the database when it starts, appends what
publishers (in this process) and the hub's Redis tail (events of runs in other processes)
send it, fills any gap from the database, writes the new frames to the readers parked on
the ring (``Ring.wake``, the fast path), and hands out subscriptions. With Redis, it also
reads the database for newer events at each beat: an event whose Redis entry was lost (Redis
down while it was published, or while the tail read) reaches its readers within a beat.
Every ``SWEEP_SECONDS`` it looks for readers stuck in a write (``Ring.stuck``) and resets
their connections (``runtime.connections``). It stops when nobody has read or written for
``idle_seconds``.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import trio

from plugins.projects.live import event_log
from plugins.projects.live.event_log import StreamEvent
from plugins.projects.live.queued import QueuedBytes
from plugins.projects.live.ring import Ring, Subscription
from runtime.actors import ActorSpec, Mailbox, Request
from runtime.backoff import outage_cause
from runtime.errors import is_outage
from runtime.service import Service

log = logging.getLogger("flowsvc.projects.stream")
SWEEP_SECONDS = 1.0
"""How often a broadcaster looks for readers stuck in a write."""


@dataclass(frozen=True)
class Subscribe(Request["tuple[Subscription, str | None]"]):
    """Message: a reader's subscription from ``last_event_id`` (without one, from the first
    event of ``latest_run_id``), and the lost-events header value if any. The reader stays
    silent at most ``heartbeat_seconds``."""

    last_event_id: str | None
    latest_run_id: str | None
    heartbeat_seconds: float


@dataclass(frozen=True)
class Append:
    """Message (cast): committed events of the stream, in order."""

    events: list[StreamEvent]


def broadcaster_name(stream: str) -> str:
    return f"projects.stream.{stream}"


def broadcaster_spec(service: Service, stream: str, ring: Ring, queued: QueuedBytes, *,
                     max_lag: int, idle_seconds: float, heartbeat_seconds: float,
                     write_timeout: float) -> ActorSpec:
    """The broadcaster actor of ``stream``, owning ``ring`` (its cuts counted in ``queued``).

    Messages: ``Subscribe`` and ``Append`` (a cast; duplicates are skipped, gaps filled from
    the database). It beats the ring every ``heartbeat_seconds`` (or its most demanding
    reader's), and cuts off readers whose write has lasted ``write_timeout`` seconds or
    that fell ``max_lag`` events behind during one. It is ``temporary``: when it ends or
    crashes, its ring is closed and readers reconnect to a fresh one.
    """

    async def append(events: list[StreamEvent]) -> None:
        for event in events:
            if event.seq <= ring.last_seq:
                continue
            if event.seq > ring.last_seq + 1:
                for missed in await service.db.read(event_log.events_between, stream,
                                                    ring.last_seq, event.seq - 1):
                    ring.append(missed)
            ring.append(event)
        queued.count_fast_path(*ring.wake())

    async def catch_up() -> None:
        """Take from the database the events the Redis tail has not brought (a ring's worth
        at most; the next beat takes more)."""
        try:
            missed = await service.db.read(event_log.events_between, stream, ring.last_seq,
                                           ring.last_seq + ring.capacity)
        except Exception as exc:
            if not is_outage(exc):
                raise
            log.warning("stream %s cannot catch up from the database (%s)", stream,
                        outage_cause(exc))
            return
        if missed:
            await append(missed)

    async def handle(message: object) -> tuple[Subscription, str | None] | None:
        match message:
            case Append(events):
                await append(events)
                return None
            case Subscribe(last_event_id, latest_run_id, reader_heartbeat):
                cursor, lost = ring.start_cursor(last_event_id, latest_run_id)
                ring.touched = trio.current_time()
                return Subscription(ring, cursor, max_lag, reader_heartbeat), lost
        raise TypeError(f"{broadcaster_name(stream)} does not understand {message!r}")

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            events, last = await service.db.read(event_log.recent_events, stream, ring.capacity)
            ring.reset(events, last)
            task_status.started()
            now = trio.current_time()
            next_beat = now + min(heartbeat_seconds, idle_seconds / 2)
            next_sweep = now + SWEEP_SECONDS
            # The shortest heartbeat of readers subscribed since the last beat: they may not
            # have joined the ring yet when the next interval is chosen.
            newcomers = math.inf
            while True:
                with trio.move_on_at(min(next_beat, next_sweep)):
                    try:
                        envelope = await mailbox.receive()
                    except (trio.EndOfChannel, trio.ClosedResourceError):
                        return
                    message = envelope.message
                    try:
                        envelope.reply(await handle(message))
                    except Exception as exc:  # the caller owns the failure
                        envelope.fail(exc)
                    if isinstance(message, Subscribe):
                        newcomers = min(newcomers, message.heartbeat_seconds)
                        next_beat = min(next_beat,
                                        trio.current_time() + message.heartbeat_seconds)
                    continue
                now = trio.current_time()
                if now >= next_sweep:
                    for reason, stuck in ring.stuck(now, write_timeout).items():
                        queued.cut_off(stuck, reason, stream)
                    next_sweep = now + SWEEP_SECONDS
                if now >= next_beat:
                    if service.shared.redis is not None:
                        await catch_up()
                    ring.beat()
                    if ring.readers == 0 and now - ring.touched >= idle_seconds:
                        return
                    next_beat = now + min(ring.heartbeat_seconds(heartbeat_seconds),
                                          newcomers, idle_seconds / 2)
                    newcomers = math.inf
        finally:
            ring.close()

    return ActorSpec(name=broadcaster_name(stream), run=run, restart="temporary",
                     mailbox_size=256)
