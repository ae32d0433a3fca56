"""Writing a streamed response's body straight to its connection, past Quart, hypercorn and h11.

A long-lived stream (Server-Sent Events) writes many small pieces. Through ASGI each piece
is a message that Quart builds, the early-response guard passes on, hypercorn's stream turns
into an h11 event, h11 frames as a chunk, and hypercorn writes under a lock and a shielded
cancel scope: 46 to 79 µs of CPU per piece (docs/performance.md). Once the response head has
gone out the normal way, what is left for each piece is its chunk framing and a write, so a
route may take the body into its own hands:

- the head and at least one body message go out through ASGI as for any response (the status,
  the headers, hypercorn's choice of framing and its logs stay as they are);
- then ``direct_writer()`` returns a :class:`DirectWriter` whose ``write`` frames a piece as
  an HTTP/1.1 chunk (``hex(len)\\r\\n data \\r\\n``) and writes it to the connection
  (``runtime.connections``), under the connection's write lock, so it never interleaves with
  hypercorn's own writes: without a checkpoint when the kernel takes it at once. While
  the response's task waits without writing, another task may write for it without
  blocking (``write_now``: only what the kernel takes at once, a chunk framed once with
  ``chunk`` for many connections); the response's task then finishes a chunk begun that
  way (``write_rest``) before anything else;
- the response ends through ASGI as usual (hypercorn writes the last chunk, ``0\\r\\n\\r\\n``,
  and keeps or closes the connection).

It relies on hypercorn's objects, which are not an API: the ASGI ``send`` hypercorn gives is
its ``HTTPStream.app_send``, whose stream sends through ``H11Protocol``, whose h11 connection
frames the body with chunks, and whose ``send`` is ``TCPServer.protocol_send`` on the
connection ``serve_http`` accepted. So it runs only with the hypercorn version it was written
for (``HYPERCORN_VERSION``, pinned in requirements.lock) and only when every link of that chain
is what it expects; anywhere else ``direct_writer()`` returns None and the route writes through
ASGI as before (the fallback): an HTTP/1.0 client (a body ended by the close, not chunked), a
server other than ``serve_http``. A link that is not what it should be is logged as a warning
once per process (``tests/runtime/test_direct_write.py`` fails on it).
"""

from __future__ import annotations

import logging
from contextvars import ContextVar
from importlib.metadata import version

import h11
from h11._writers import ChunkedWriter
from hypercorn.protocol.h11 import H11Protocol
from hypercorn.protocol.http_stream import ASGIHTTPState, HTTPStream
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.typing import ASGISendCallable

from runtime.connections import _Connection

log = logging.getLogger("flowsvc.http")

HYPERCORN_VERSION = "0.18.0"
"""The hypercorn whose objects ``direct_writer`` knows; requirements.lock pins it."""
_INSTALLED_HYPERCORN = version("hypercorn")
_SERVER_SEND: ContextVar[ASGISendCallable] = ContextVar("flowsvc_server_send")
_warned: set[str] = set()


def remember_server_send(send: ASGISendCallable) -> None:
    """Note the ASGI ``send`` the server gave the current request (the early-response guard
    calls it before the app), for ``direct_writer``."""
    _SERVER_SEND.set(send)


def chunk(data: bytes) -> bytes:
    """``data`` framed as one HTTP/1.1 chunk (``data`` not empty: an empty chunk ends a body)."""
    return b"%x\r\n%b\r\n" % (len(data), data)


class DirectWriter:
    """Writes the body of the current response as HTTP/1.1 chunks straight to its
    connection: ``write`` only from the task that sends the response; ``write_now`` from
    any task while that one waits without writing, and then ``write_rest`` from it."""

    __slots__ = ("_connection",)

    def __init__(self, connection: _Connection) -> None:
        self._connection = connection

    async def write(self, data: bytes) -> None:
        """Write ``data`` as one chunk (nothing for empty ``data``: an empty chunk would end
        the body). A write interrupted half-way resets the connection: what follows could
        not be framed.

        :raises trio.BrokenResourceError: the client is gone (or the connection was reset).
        :raises trio.ClosedResourceError: the connection is closed.
        """
        if data:
            await self._send(chunk(data))

    def write_now(self, framed: bytes) -> int:
        """Write what the kernel takes at once of ``framed`` (a ``chunk``), without waiting.
        Returns how many bytes went out; when not all, the response's task must write the
        rest (``write_rest``) before anything else. A failure resets the connection.

        :raises trio.BrokenResourceError: the client is gone (or the connection was reset).
        :raises trio.ClosedResourceError: the connection is closed.
        """
        try:
            return self._connection.send_now(framed)
        except BaseException:
            self._connection.reset()
            raise

    async def write_rest(self, rest: bytes | memoryview) -> None:
        """Write the end of a chunk ``write_now`` began (as ``write``: an interruption
        resets the connection).

        :raises trio.BrokenResourceError: the client is gone (or the connection was reset).
        :raises trio.ClosedResourceError: the connection is closed.
        """
        await self._send(rest)

    async def _send(self, framed: bytes | memoryview) -> None:
        try:
            await self._connection.send_soon(framed)
        except BaseException:
            self._connection.reset()
            raise


def direct_writer() -> DirectWriter | None:
    """A writer for the body of the current request's response, once its head and a first
    body message have gone out through ASGI; None when the body must keep going through
    ASGI (see the module docstring)."""
    send = _SERVER_SEND.get(None)
    if send is None:
        return None
    connection = _chunked_connection(send)
    if isinstance(connection, str):
        if connection not in _warned:
            _warned.add(connection)
            log.warning("stream bodies go through ASGI (slower): %s", connection)
        return None
    return None if connection is None else DirectWriter(connection)


def _chunked_connection(send: ASGISendCallable) -> _Connection | str | None:
    """The connection behind hypercorn's ``send`` when its response body is being sent with
    chunks; None when it is not (HTTP/1.0, HTTP/2: nothing to warn about); what is wrong
    when hypercorn's objects are not the ones this module knows."""
    if _INSTALLED_HYPERCORN != HYPERCORN_VERSION:
        return f"hypercorn is {_INSTALLED_HYPERCORN}, not {HYPERCORN_VERSION}"
    stream = getattr(send, "__self__", None)
    if not isinstance(stream, HTTPStream):
        return f"the ASGI send is {send!r}, not hypercorn's HTTPStream.app_send"
    if stream.state is not ASGIHTTPState.RESPONSE:
        return f"the response's state is {stream.state}, not RESPONSE, after its head"
    protocol = getattr(stream.send, "__self__", None)
    if not isinstance(protocol, H11Protocol):
        return None  # HTTP/2, or a WebSocket
    writer = getattr(protocol.connection, "_writer", None)
    if not isinstance(protocol.connection, h11.Connection) or \
            protocol.connection.our_state is not h11.SEND_BODY:
        return "hypercorn's h11 connection is not sending a body after the response head"
    if not isinstance(writer, ChunkedWriter):
        return None  # HTTP/1.0: the body ends with the connection
    server = getattr(protocol.send, "__self__", None)
    if not isinstance(server, TCPServer) or not isinstance(server.stream, _Connection):
        return f"hypercorn's protocol sends through {protocol.send!r}, not serve_http's"
    return server.stream

