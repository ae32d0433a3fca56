"""Answering an HTTP/1 request before its body has arrived, without hanging the connection.

Hypercorn (0.18, Trio worker) settles a connection inside the app's own ``send`` of the last
response message: it tells the app ``http.disconnect``, then either starts the next request
cycle (the request body had fully arrived and nobody said ``Connection: close``) or closes
the socket. quart-trio cancels its response task as soon as it reads ``http.disconnect``, and
that task is the one running hypercorn's close (``TCPServer._close``), which is cancelled at
its first checkpoint (``send_eof``). The socket stays open and nothing reads another request
on it: an answer given before the request body has arrived (a 401 from a before-request hook,
a 405, a 413) hangs the kept-alive connection, and a ``Connection: close`` is never carried
out by the server. docs/hypercorn-early-response.md has the reproduction and the source walk.

``guard_early_responses`` wraps the app so that this never happens to flowsvc:

- when the request body has not fully arrived by the last response message, the rest is read
  and discarded first (at most ``max_drain_bytes`` of body in all, within ``drain_seconds``),
  so that hypercorn finds the request complete and keeps the connection alive;
- an early answer to a declared body over ``max_drain_bytes`` says ``Connection: close``: that
  body is not waited for;
- when hypercorn is going to close (the body is still unfinished, HTTP/1.0, or a
  ``Connection: close`` either way), the app hears ``http.disconnect`` only once the ``send``
  of the last message has returned, so the close really happens;
- each request marks its connection busy, and idle again once answered, for the keep-alive
  idle timeout that ``runtime.connections`` keeps (hypercorn's own timer is not restarted
  after the first request, see below);
- the server's own ``send`` of each request is noted for ``runtime.direct_write``;
- a request with both ``Content-Length`` and ``Transfer-Encoding`` gets a 400
  ``invalid_request`` and the connection is closed (RFC 9112 section 6.1), without calling
  the app: whatever follows on the connection (a smuggled request) is never read.

A kept-alive exchange is otherwise left as it is: no task, no cancel scope, no extra
checkpoint, a few checks per ASGI message. (There, the same cancellation stops hypercorn
from restarting its keep-alive idle timer, a task per request; ``runtime.connections`` keeps
the idle timeout instead, with a deadline on the connection's cancel scope.)
"""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import trio
from hypercorn.typing import (
    ASGIFramework,
    ASGIReceiveCallable,
    ASGIReceiveEvent,
    ASGISendCallable,
    ASGISendEvent,
    HTTPResponseStartEvent,
    Scope,
)

from runtime.connections import closing_answer, request_began, request_ended
from runtime.direct_write import remember_server_send
from runtime.errors import InvalidRequest

log = logging.getLogger("flowsvc.http")

DRAIN_SECONDS = 5.0
"""How long the rest of a request body is waited for after an early answer."""
_HTTP1 = frozenset({"1.0", "1.1"})


def guard_early_responses(app: ASGIFramework, *, max_drain_bytes: int,
                          drain_seconds: float = DRAIN_SECONDS) -> ASGIFramework:
    """``app`` behind the guard described in the module docstring.

    :param max_drain_bytes: the largest request body read and discarded to keep a connection
        alive (flowsvc passes ``service.max_body_bytes``: a body it would have accepted).
    :param drain_seconds: how long the rest of such a body is waited for.
    """

    async def guarded(scope: Scope, receive: ASGIReceiveCallable,
                      send: ASGISendCallable) -> None:
        if scope["type"] != "http" or scope["http_version"] not in _HTTP1:
            await app(scope, receive, send)  # lifespan; an HTTP/2 stream ends on its own
            return
        if _ambiguous_framing(scope["headers"]):
            await _refuse_ambiguous_framing(send)
            return
        exchange = _Exchange(scope["headers"], scope["http_version"] == "1.0", receive, send,
                             max_drain_bytes, drain_seconds)
        request = request_began()
        remember_server_send(send)
        try:
            await app(scope, exchange.receive, exchange.send)
        finally:
            request_ended(request)

    return guarded


def _ambiguous_framing(headers: Any) -> bool:
    """Both ``Content-Length`` and ``Transfer-Encoding``: a proxy in front may have read the
    body by the other one, so what follows it on the connection may be a smuggled request."""
    names = {name for name, _value in headers}
    return b"content-length" in names and b"transfer-encoding" in names


async def _refuse_ambiguous_framing(send: ASGISendCallable) -> None:
    """Answer 400 and close the connection (RFC 9112 section 6.1), without calling the app;
    nothing else is read from this connection."""
    error = InvalidRequest("a request may not carry both Content-Length and Transfer-Encoding")
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    async with closing_answer():
        await send({"type": "http.response.start", "status": error.status, "trailers": False,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body, "more_body": False})


def _request_framing(headers: Any) -> tuple[bool, int | None, bool]:
    """Whether a body is to come, its declared length (None: chunked), and ``Connection:
    close``."""
    has_body, close = False, False
    length: int | None = 0
    for name, value in headers:  # hypercorn passes h11's lower-cased names
        if name == b"content-length":
            length = int(value)
            has_body = length > 0
        elif name == b"transfer-encoding":
            has_body, length = True, None
        elif name == b"connection":
            close = close or b"close" in value.lower()
    return has_body, length, close


def _says_close(headers: list[tuple[bytes, bytes]]) -> bool:
    for name, value in headers:
        if name.lower() == b"connection" and b"close" in value.lower():
            return True
    return False


class _Exchange:
    """One request and its response on their way between hypercorn and the app."""

    __slots__ = ("_closing", "_drain_scope", "_finishing", "_limit", "_receive", "_seconds",
                 "_send", "declared", "received", "unfinished")

    def __init__(self, headers: Any, http10: bool, receive: ASGIReceiveCallable,
                 send: ASGISendCallable, limit: int, seconds: float) -> None:
        self._receive = receive
        self._send = send
        self._limit = limit
        self._seconds = seconds
        self._drain_scope: trio.CancelScope | None = None
        self._finishing: trio.Event | None = None
        self.unfinished, self.declared, close = _request_framing(headers)
        self._closing = close or http10  # h11 keeps no HTTP/1.0 connection alive
        self.received = 0

    async def receive(self) -> ASGIReceiveEvent:
        """hypercorn's next message, noting how much of the request body has arrived.

        ``http.disconnect`` is held back while hypercorn is closing the connection in the last
        ``send``: quart-trio would cancel that very send.
        """
        message = await self._receive()
        if self.unfinished:
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                self.unfinished = message.get("more_body", False)
            else:  # http.disconnect: nothing more will come
                self.unfinished = False
            if self._drain_scope is not None and not self._drainable():
                self._drain_scope.cancel()  # the app's own reader took the last part
        if self._finishing is not None and message["type"] == "http.disconnect":
            await self._finishing.wait()
        return message

    def _drainable(self) -> bool:
        return self.unfinished and self.received <= self._limit

    async def send(self, message: ASGISendEvent) -> None:
        """Pass ``message`` on; before the last one, drain what is left of the request."""
        if message["type"] == "http.response.start":
            message = self._start(message)
        elif message["type"] == "http.response.body" and not message.get("more_body", False):
            if self.unfinished and not self._closing:
                await self._drain()
            if not (self.unfinished or self._closing):
                await self._send(message)  # hypercorn recycles the connection in here
                return
            self._finishing = trio.Event()
            try:
                await self._send(message)  # hypercorn closes the connection in here
            finally:
                self._finishing.set()
            return
        await self._send(message)

    def _start(self, message: HTTPResponseStartEvent) -> HTTPResponseStartEvent:
        headers = list(message["headers"])
        if _says_close(headers):
            self._closing = True
        elif self.unfinished and self.declared is not None and self.declared > self._limit:
            self._closing = True
            headers.append((b"connection", b"close"))
            return cast(HTTPResponseStartEvent, {**message, "headers": headers})
        return message

    async def _drain(self) -> None:
        with trio.move_on_after(self._seconds) as self._drain_scope:
            while self._drainable():
                await self.receive()
        self._drain_scope = None
        if self.unfinished:
            log.info("closing a connection after an early answer: the request body is %s",
                     "over the limit" if self.received > self._limit else "too slow to come")
