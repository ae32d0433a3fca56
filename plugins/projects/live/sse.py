"""The live build stream over Server-Sent Events, for any stream of the event log.

A response starts with a ``retry:`` hint, replays what the reader missed and then sends
events as they come, every pending frame in one write. A reader silent for
``heartbeat_seconds`` sends a ``: keepalive`` comment at the broadcaster's next beat (so
between one and two heartbeat periods of silence), which keeps idle connections and
proxies open. When the requested ``Last-Event-ID`` is older than the ring or unknown, the
response carries the Mercure signal: a ``Last-Event-ID`` header with the id before the
first event sent (``-1`` when there is none), and the reader gets the whole ring. A
reader that falls too far behind is disconnected and resumes with ``Last-Event-ID``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import trio
from quart import Response, request

from plugins.projects.live.hub import subscribe
from plugins.projects.live.ring import Lagged, Subscription
from plugins.projects.settings import ProjectsSettings
from runtime.http import SSE_HEADERS
from runtime.service import Service

LOST_HEADER = "Last-Event-ID"


def requested_last_event_id() -> str | None:
    """The ``Last-Event-ID`` header, else the ``lastEventId`` query parameter (for clients
    that cannot set headers), else None."""
    value = request.headers.get("Last-Event-ID")
    if value is None:
        value = request.args.get("lastEventId")
    return value


async def _frames(subscription: Subscription, settings: ProjectsSettings,
                  lost: str | None) -> AsyncIterator[bytes]:
    with subscription:
        head = f"retry: {settings.retry_ms}\n\n"
        if lost is not None:
            head += f": events were lost; the replay starts after {lost}\n\n"
        yield head.encode()
        last_write = trio.current_time()
        while True:
            try:
                chunk = subscription.take()
            except Lagged as lagged:
                yield f": disconnected, {lagged}; reconnect with Last-Event-ID\n\n".encode()
                return
            if chunk:
                yield chunk
                last_write = trio.current_time()
                continue
            if subscription.closed:
                return
            if trio.current_time() - last_write >= settings.heartbeat_seconds:
                yield b": keepalive\n\n"
                last_write = trio.current_time()
            await subscription.wait()


async def stream_response(service: Service, settings: ProjectsSettings, stream: str,
                          last_event_id: str | None, latest_run_id: str | None) -> Response:
    """The ``text/event-stream`` response of ``stream`` from ``last_event_id`` on (without
    one: from the first event of ``latest_run_id``, the stream's latest run).

    :raises Unavailable: the stream's broadcaster could not be started.
    """
    subscription, lost = await subscribe(service, stream, last_event_id, latest_run_id)
    headers = {name: value for name, value in SSE_HEADERS.items() if name != "Content-Type"}
    if lost is not None:
        headers[LOST_HEADER] = lost
    response = Response(_frames(subscription, settings, lost), status=200, headers=headers,
                        content_type="text/event-stream")
    response.timeout = None  # a stream is open-ended; Quart would cut it after 60 s
    return response
