"""The live build stream over Server-Sent Events, for any stream of the event log.

A response starts with a ``retry:`` hint, replays what the reader missed and then sends
events as they come, every pending frame at once: joined into writes of at most
``live.ring.WRITE_BYTES``, each counted against the process's budget of bytes queued to
readers (``subscriber_queued_bytes``) while it lasts. The first write goes out through ASGI
with the response head; the later ones go straight to the connection
(``runtime.direct_write``) where the server allows it, else through ASGI as well. A reader
writing straight to its connection that has caught up leaves the next events to the
broadcaster, which writes them to all such readers at once (``Ring.wake``), until it hands
the reader back (its socket full, a backlog, a heartbeat due). A reader
silent for its heartbeat interval sends a ``: keepalive`` comment at the broadcaster's next
beat (so between one and two intervals of silence), which keeps idle connections and proxies
open. A caller with the ``fasterSse`` feature gets the shorter ``faster_heartbeat_seconds``
and ``faster_retry_ms``. When the requested ``Last-Event-ID`` is older than the ring or
unknown, the response carries the Mercure signal: a ``Last-Event-ID`` header with the id
before the first event sent (``-1`` when there is none), and the reader gets the whole
ring. A reader that falls too far behind, or whose write does not finish within
``subscriber_write_timeout_seconds``, is disconnected and resumes with ``Last-Event-ID``;
so is every reader when the process drains (``live.drain``).

Streams are anonymous, so each client address (as the request pipeline resolved it,
``trusted_proxies`` included) may hold at most ``streams_per_client`` of them open in a
process; one more is refused with 429 ``too_many_streams``.
"""

from __future__ import annotations

import weakref
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass

import trio
from quart import Response, request

from plugins.projects.errors import TooManyStreams
from plugins.projects.live.drain import end_on_drain
from plugins.projects.live.hub import subscribe
from plugins.projects.live.queued import QUEUED_BYTES, QueuedBytes, pieces
from plugins.projects.live.ring import Lagged, Subscription
from plugins.projects.settings import ProjectsSettings
from runtime.connections import current_connection
from runtime.context import current_context
from runtime.direct_write import DirectWriter, direct_writer
from runtime.http import SSE_HEADERS
from runtime.service import Service, StateSlot

LOST_HEADER = "Last-Event-ID"
KEEPALIVE = b": keepalive\n\n"
STREAM_SLOT_RETRY_SECONDS = 5
"""The ``Retry-After`` of a stream refused for the client's cap."""


@dataclass(frozen=True)
class Pacing:
    """How often a reader hears from a silent stream, and how soon it reconnects."""

    heartbeat_seconds: float
    retry_ms: int


class OpenStreams:
    """How many streams each client address holds open in this service."""

    def __init__(self) -> None:
        self._by_client: Counter[str] = Counter()

    def take(self, client: str, cap: int) -> StreamSlot:
        """One more stream for ``client``.

        :raises TooManyStreams: ``client`` already holds ``cap`` streams.
        """
        if self._by_client[client] >= cap:
            raise TooManyStreams(
                f"this address already holds {cap} open streams; close one first",
                retry_after=STREAM_SLOT_RETRY_SECONDS)
        self._by_client[client] += 1
        return StreamSlot(self, client)

    def give_back(self, client: str) -> None:
        self._by_client[client] -= 1
        if not self._by_client[client]:
            del self._by_client[client]


class StreamSlot:
    """One open stream of a client; ``release`` it once (later calls do nothing)."""

    def __init__(self, streams: OpenStreams, client: str) -> None:
        self._streams: OpenStreams | None = streams
        self._client = client

    def release(self) -> None:
        if self._streams is not None:
            self._streams.give_back(self._client)
            self._streams = None


OPEN_STREAMS: StateSlot[OpenStreams] = StateSlot("projects.open_streams",
                                                  lambda service: OpenStreams())


def requested_last_event_id() -> str | None:
    """The ``Last-Event-ID`` header, else the ``lastEventId`` query parameter (for clients
    that cannot set headers), else None."""
    value = request.headers.get("Last-Event-ID")
    if value is None:
        value = request.args.get("lastEventId")
    return value


async def _pacing(service: Service, settings: ProjectsSettings) -> Pacing:
    """The current caller's pacing: faster with the ``fasterSse`` feature."""
    principal = current_context().principal
    if principal is not None and principal.via != "internal" and \
            (await service.features(principal.user_id)).get("fasterSse", False):
        return Pacing(settings.faster_heartbeat_seconds, settings.faster_retry_ms)
    return Pacing(settings.heartbeat_seconds, settings.retry_ms)


def _disconnected(lagged: Lagged) -> bytes:
    return f": disconnected, {lagged}; reconnect with Last-Event-ID\n\n".encode()


async def _frames(subscription: Subscription, pacing: Pacing, lost: str | None,
                  slot: StreamSlot, queued: QueuedBytes) -> AsyncIterator[bytes]:
    head = f"retry: {pacing.retry_ms}\n\n"
    if lost is not None:
        head += f": events were lost; the replay starts after {lost}\n\n"
    pending = [head.encode()]
    writer: DirectWriter | None = None
    head_sent = False
    try:
        with subscription:
            while True:
                subscription.unsent = sum(map(len, pending))
                for piece in pieces(pending):
                    try:
                        await queued.acquire(subscription, len(piece))
                    except Lagged as lagged:  # cut off while it waited: counted then
                        yield _disconnected(lagged)
                        return
                    try:
                        if writer is None:
                            yield piece
                        else:
                            await writer.write(piece)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        return  # the connection is gone (a direct write): nothing to resume
                    finally:
                        queued.release(subscription)
                    subscription.unsent -= len(piece)
                    if not head_sent:  # it went out with the first piece
                        head_sent = True
                        writer = direct_writer()
                subscription.last_write = trio.current_time()
                while True:
                    try:
                        pending = subscription.take()
                    except Lagged as lagged:
                        if subscription.dropped is None:  # else counted when it was cut
                            queued.cut.labels(reason="lag").inc()
                        yield _disconnected(lagged)
                        return
                    if pending:
                        break
                    if subscription.closed:
                        return
                    if trio.current_time() - subscription.last_write >= pacing.heartbeat_seconds:
                        pending = [KEEPALIVE]
                        break
                    if writer is None:  # through ASGI: this task writes every event
                        await subscription.wait()
                        continue
                    # Caught up: the ring writes the next events itself (the fast path), until
                    # it hands the reader back.
                    await subscription.park(writer)
                    if subscription.gone or \
                            (subscription.rest and not await _finish_chunk(subscription, writer,
                                                                           queued)):
                        return
    finally:
        slot.release()


async def _finish_chunk(subscription: Subscription, writer: DirectWriter,
                        queued: QueuedBytes) -> bool:
    """Write the end of the chunk the ring began for ``subscription`` (counted like any
    write); False when the stream must end: the connection is gone, or the reader was cut
    off while it waited for the budget (its connection is reset then: nothing else may be
    written in the middle of a chunk)."""
    rest, subscription.rest = subscription.rest, b""
    subscription.unsent = len(rest)  # what the budget sorts the readers to cut by
    try:
        await queued.acquire(subscription, len(rest))
    except Lagged:
        if subscription.connection is not None:
            subscription.connection.reset()
        return False
    try:
        await writer.write_rest(rest)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        return False
    finally:
        queued.release(subscription)
    subscription.unsent = 0
    subscription.last_write = trio.current_time()
    return True


async def stream_response(service: Service, settings: ProjectsSettings, stream: str,
                          last_event_id: str | None, latest_run_id: str | None) -> Response:
    """The ``text/event-stream`` response of ``stream`` from ``last_event_id`` on (without
    one: from the first event of ``latest_run_id``, the stream's latest run).

    :raises TooManyStreams: the client's address holds ``streams_per_client`` streams.
    :raises Unavailable: the stream's broadcaster could not be started.
    """
    slot = service.state(OPEN_STREAMS).take(current_context().client_ip,
                                            settings.streams_per_client)
    try:
        pacing = await _pacing(service, settings)
        subscription, lost = await subscribe(service, stream, last_event_id, latest_run_id,
                                             pacing.heartbeat_seconds)
    except BaseException:
        slot.release()
        raise
    subscription.connection = current_connection()
    end_on_drain(service, subscription)
    headers = {name: value for name, value in SSE_HEADERS.items() if name != "Content-Type"}
    if lost is not None:
        headers[LOST_HEADER] = lost
    body = _frames(subscription, pacing, lost, slot, service.state(QUEUED_BYTES))
    # A body never started (the client left before it) runs no ``finally``: give the
    # slot back when it is dropped instead.
    weakref.finalize(body, slot.release)
    response = Response(body, status=200, headers=headers, content_type="text/event-stream")
    response.timeout = None  # a stream is open-ended; Quart would cut it after 60 s
    return response
