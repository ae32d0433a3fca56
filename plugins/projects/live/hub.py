"""The stream hub: finds or starts a stream's broadcaster, and tails Redis for other processes.

One hub actor per process (``projects.streams``). ``OpenStream(stream)`` returns the
address of the stream's broadcaster, starting it under the hub's own supervisor (the
projects part's) when none runs. With Redis,
the hub also tails the Redis Streams of every broadcaster of this process, so events
published by a run in another process reach readers here: one blocking ``XREAD`` per hash
slot of the streams' partitions (``event_log.stream_partition``): one on one Redis, one per
partition on a Redis Cluster, which refuses a read across slots. A new broadcaster
interrupts the read of its partition through a small wake-up stream of the process in that
partition's slot, so it is included at once. It also enforces the process's budget of bytes
queued to readers (``live.queued``): every ``SWEEP_SECONDS`` it cuts off the readers the
budget picks.
"""

from __future__ import annotations

import logging
import secrets
from dataclasses import dataclass
from typing import Any

import trio

from plugins.projects.live import event_log
from plugins.projects.live.broadcaster import (
    SWEEP_SECONDS,
    Append,
    Subscribe,
    broadcaster_name,
    broadcaster_spec,
)
from plugins.projects.live.event_log import StreamEvent
from plugins.projects.live.queued import QUEUED_BYTES
from plugins.projects.live.ring import Ring, Subscription
from plugins.projects.settings import ProjectsSettings
from runtime.actors import ActorSpec, Address, Mailbox, Request, serve_mailbox
from runtime.backoff import Backoff, outage_cause
from runtime.errors import Unavailable, is_outage
from runtime.service import Service
from runtime.shared import RedisAccess
from runtime.supervisor import current_supervisor

log = logging.getLogger("flowsvc.projects.streams")
HUB = "projects.streams"
_XREAD_BLOCK_MS = 5000
_OPEN_ATTEMPTS = 3


@dataclass(frozen=True)
class OpenStream(Request[Address]):
    """Message to the hub: the address of ``stream``'s broadcaster (started if need be)."""

    stream: str


async def subscribe(service: Service, stream: str, last_event_id: str | None,
                    latest_run_id: str | None, heartbeat_seconds: float
                    ) -> tuple[Subscription, str | None]:
    """A reader's subscription to ``stream``, and the lost-events header value if any.

    :param latest_run_id: the stream's latest run: a reader without ``Last-Event-ID``
        starts at its first event.
    :param heartbeat_seconds: how long the reader may stay silent.

    :raises Unavailable: no broadcaster could be started.
    """
    hub = service.registry.lookup(HUB)
    for _ in range(_OPEN_ATTEMPTS):
        address = await hub.call(OpenStream(stream))
        try:
            return await address.call(Subscribe(last_event_id, latest_run_id,
                                                heartbeat_seconds))
        except Unavailable:
            continue  # it stopped for idleness as we arrived: the hub starts a fresh one
    raise Unavailable(f"the broadcaster of {stream} is unavailable")


async def deliver_local(service: Service, stream: str, events: list[StreamEvent]) -> None:
    """Hand committed events to the stream's broadcaster in this process, if one runs."""
    address = service.registry.get(broadcaster_name(stream))
    if address is None or not events:
        return
    try:
        await address.cast(Append(events))
    except Unavailable:
        pass  # it just stopped; a new one loads these events from the database


def hub_spec(service: Service, settings: ProjectsSettings) -> ActorSpec:
    """The hub actor. Message: ``OpenStream`` (its reply is the broadcaster's address)."""
    rings: dict[str, Ring] = {}
    queued = service.state(QUEUED_BYTES)
    redis = service.shared.redis
    wake_id = secrets.token_hex(8)

    def wake_stream(partition: int) -> str:
        return f"projects:{event_log.partition_tag(partition)}:wake:{wake_id}"

    async def open_broadcaster(stream: str) -> Address:
        address = service.registry.get(broadcaster_name(stream))
        if address is not None:
            return address
        ring = Ring(settings.replay_events)
        # Under the hub's own supervisor (the projects part's): a broadcaster that crashes
        # in a loop takes that part down for a while, never the service.
        address = await current_supervisor().start(broadcaster_spec(
            service, stream, ring, queued, max_lag=settings.subscriber_max_lag,
            idle_seconds=settings.stream_idle_seconds,
            heartbeat_seconds=settings.heartbeat_seconds,
            write_timeout=settings.subscriber_write_timeout_seconds))
        if redis is not None:
            rings[stream] = ring  # the tail reads the Redis Stream of each open ring
            try:
                await redis.stream_add(wake_stream(event_log.stream_partition(stream)),
                                       [("*", {"stream": stream})], max_length=10)
            except Exception:
                log.warning("could not wake the Redis tail", exc_info=True)
        return address

    async def tail(redis: RedisAccess, partitions: list[int]) -> None:
        """Read the streams of ``partitions`` (all in one hash slot) and their wake-ups."""
        backoff = Backoff()
        while True:
            for stream in [stream for stream, ring in rings.items() if ring.closed]:
                del rings[stream]
            keys = {event_log.redis_stream(stream): stream for stream in rings
                    if event_log.stream_partition(stream) in partitions}
            positions: dict[str, str] = {key: f"0-{rings[stream].last_seq}"
                                         for key, stream in keys.items()}
            positions.update((wake_stream(partition), "$") for partition in partitions)
            try:
                reply = await redis.stream_read(positions, count=1000, block_ms=_XREAD_BLOCK_MS)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # What is published meanwhile reaches readers through the broadcasters'
                # catch-up from the database.
                delay = backoff.next_delay()
                log.warning("reading the Redis streams failed (%s); retrying in %.1f s",
                            outage_cause(exc), delay)
                await trio.sleep(delay)
                continue
            backoff.reset()
            for key, entries in reply.items():
                stream_of_key = keys.get(key)
                if stream_of_key is not None:
                    await deliver_local(service, stream_of_key, [
                        event_log.event_from_entry(entry) for entry in entries])

    async def enforce_budget() -> None:
        while True:
            await trio.sleep(SWEEP_SECONDS)
            queued.cut_off(queued.over_budget(trio.current_time()), "queued_bytes",
                           "this process")

    async def handle(message: object) -> Address:
        if not isinstance(message, OpenStream):
            raise TypeError(f"{HUB} does not understand {message!r}")
        return await open_broadcaster(message.stream)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            if redis is not None:
                by_slot: dict[int, list[int]] = {}
                for partition in range(event_log.STREAM_PARTITIONS):
                    by_slot.setdefault(redis.slot(wake_stream(partition)), []).append(partition)
                for partitions in by_slot.values():
                    nursery.start_soon(tail, redis, partitions)
            nursery.start_soon(enforce_budget)
            task_status.started()
            await serve_mailbox(mailbox, handle)
            nursery.cancel_scope.cancel()

    return ActorSpec(name=HUB, run=run, mailbox_size=1024)
