"""A small Server-Sent Events client over real sockets (h11), for tests and benchmarks.

It reads the raw stream, so tests see exactly what a browser's EventSource would: ids,
event names, data, comments and the ``retry:`` hint, plus the response headers. It can
also shrink its socket's receive buffer to play a subscriber that stalls.
"""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import h11
import trio


@dataclass(frozen=True)
class SseEvent:
    id: str | None
    event: str
    data: str

    def json(self) -> Any:
        return json.loads(self.data)


@dataclass
class SseStream:
    """One open stream: its status, headers, and what has been parsed from it so far."""

    status: int
    headers: dict[str, str]
    _stream: trio.SocketStream
    _connection: h11.Connection
    _buffer: str = ""
    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)
    retry: int | None = None
    ended: bool = False
    _read: int = 0

    @property
    def socket(self) -> trio.socket.SocketType:
        """The connection's socket (to ask the kernel about it without reading)."""
        return self._stream.socket

    async def _feed(self) -> None:
        """Receive and parse one more piece of the body (sets ``ended`` at its end)."""
        while True:
            event = self._connection.next_event()
            if event is h11.NEED_DATA:
                data = await self._stream.receive_some(65536)
                self._connection.receive_data(data)
                continue
            if isinstance(event, h11.Data):
                self._parse(bytes(event.data).decode())
                return
            if isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                self.ended = True
                return

    def _parse(self, text: str) -> None:
        # One split per piece, not one per event: a catching-up write can hold megabytes.
        *blocks, self._buffer = (self._buffer + text).split("\n\n")
        for block in blocks:
            fields: dict[str, str] = {}
            for line in block.split("\n"):
                if line.startswith(":"):
                    self.comments.append(line[1:].strip())
                    continue
                name, _, value = line.partition(":")
                fields[name] = value[1:] if value.startswith(" ") else value
            if "retry" in fields:
                self.retry = int(fields["retry"])
            if "data" in fields:
                self.events.append(SseEvent(fields.get("id"), fields.get("event", "message"),
                                            fields["data"]))

    async def next_event(self, timeout: float = 10.0) -> SseEvent:
        """The next event not returned yet.

        :raises EOFError: the stream ended first.
        """
        with trio.fail_after(timeout):
            while self._read >= len(self.events):
                if self.ended:
                    raise EOFError("the stream ended")
                await self._feed()
        self._read += 1
        return self.events[self._read - 1]

    async def until(self, name: str, timeout: float = 30.0) -> list[SseEvent]:
        """Read until an event named ``name``; every event read so far (from the start)."""
        with trio.fail_after(timeout):
            while True:
                event = await self.next_event(timeout)
                if event.event == name:
                    return self.events[:self._read]

    async def until_end(self, timeout: float = 30.0) -> None:
        """Read until the server ends the stream."""
        with trio.fail_after(timeout):
            while not self.ended:
                await self._feed()

    async def body(self) -> bytes:
        """The whole body of a response that is not a stream (an error)."""
        data = b""
        while True:
            event = self._connection.next_event()
            if event is h11.NEED_DATA:
                self._connection.receive_data(await self._stream.receive_some(65536))
            elif isinstance(event, h11.Data):
                data += bytes(event.data)
            else:
                return data


@asynccontextmanager
async def open_sse(base_url: str, path: str, headers: dict[str, str] | None = None, *,
                   receive_buffer: int | None = None) -> AsyncIterator[SseStream]:
    """Open ``GET path`` on ``base_url`` and read its response head.

    :param receive_buffer: shrink the socket's receive buffer to this many bytes (a
        subscriber that stalls fills it fast and makes the server's writes block).
    """
    parts = urlsplit(base_url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    await sock.connect((host, port))
    stream = trio.SocketStream(sock)
    async with stream:
        connection = h11.Connection(h11.CLIENT)
        request_headers = [("Host", f"{host}:{port}"), ("Accept", "text/event-stream"),
                           *(headers or {}).items()]
        await stream.send_all(connection.send(h11.Request(method="GET", target=path,
                                                          headers=request_headers)))
        await stream.send_all(connection.send(h11.EndOfMessage()))
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                connection.receive_data(await stream.receive_some(65536))
                continue
            assert isinstance(event, h11.Response), event
            break
        head = {name.decode().lower(): value.decode() for name, value in event.headers}
        yield SseStream(event.status_code, head, stream, connection)


async def follow(base_url: str, path: str, *, until: str = "done", timeout: float = 60.0
                 ) -> tuple[list[SseEvent], int]:
    """Read a stream the way EventSource does: when the server ends it (a reader that fell
    behind is disconnected), reconnect with ``Last-Event-ID``; stop at an event named
    ``until``.

    :return: every event read, and how many times it reconnected.
    """
    events: list[SseEvent] = []
    reconnects = 0
    with trio.fail_after(timeout):
        while True:
            headers = {"Last-Event-ID": str(events[-1].id)} if events else {}
            async with open_sse(base_url, path, headers) as stream:
                while True:
                    try:
                        event = await stream.next_event(timeout)
                    except EOFError:
                        break
                    events.append(event)
                    if event.event == until:
                        return events, reconnects
            reconnects += 1
