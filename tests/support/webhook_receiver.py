"""A real HTTP receiver of webhook deliveries on a loopback port, for tests and benchmarks.

It runs in the caller's Trio run (HTTP/1.1 over h11, keep-alive included), records every
request with its arrival time and raw body, and answers what ``respond`` decides, so a test can
make a receiver fail twice then succeed, time out, or redirect.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial

import h11
import trio


@dataclass(frozen=True)
class Received:
    """One request as it arrived: ``at`` is ``time.time()`` (comparable across processes)."""

    at: float
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Reply:
    """What the receiver answers: a status, extra headers, a body, and optionally a delay
    first or an event to wait for first (the test decides when the sender gets its answer)."""

    status: int = 204
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    delay: float = 0.0
    hold: trio.Event | None = None


Respond = Callable[[Received], Reply]


class Receiver:
    """Records requests and answers them with ``respond`` (default: 204 to everything)."""

    def __init__(self, respond: Respond | None = None) -> None:
        self.respond: Respond = respond or (lambda _request: Reply())
        self.received: list[Received] = []
        self.port = 0
        self._arrived = trio.Event()

    def url(self, path: str = "/hook") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[Received]:
        """Wait until ``count`` requests have arrived; return them all.

        :raises trio.TooSlowError: fewer arrived within ``timeout`` seconds.
        """
        with trio.fail_after(timeout):
            while len(self.received) < count:
                self._arrived = trio.Event()
                await self._arrived.wait()
        return list(self.received)

    async def handle(self, stream: trio.SocketStream) -> None:
        """Serve one connection until the client closes it."""
        connection = h11.Connection(h11.SERVER)
        try:
            while True:
                request = await self._read_request(connection, stream)
                if request is None:
                    return
                self.received.append(request)
                self._arrived.set()
                reply = self.respond(request)
                if reply.delay:
                    await trio.sleep(reply.delay)
                if reply.hold is not None:
                    await reply.hold.wait()
                headers = [("content-length", str(len(reply.body))), *reply.headers.items()]
                await stream.send_all(connection.send(h11.Response(status_code=reply.status,
                                                                   headers=headers)) or b"")
                if reply.body:
                    await stream.send_all(connection.send(h11.Data(data=reply.body)) or b"")
                await stream.send_all(connection.send(h11.EndOfMessage()) or b"")
                if connection.our_state is not h11.DONE or \
                        connection.their_state is not h11.DONE:
                    return
                connection.start_next_cycle()
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            return
        finally:
            await stream.aclose()

    @staticmethod
    async def _read_request(connection: h11.Connection, stream: trio.SocketStream
                            ) -> Received | None:
        head: h11.Request | None = None
        body = bytearray()
        while True:
            event = connection.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                connection.receive_data(data)
                continue
            if isinstance(event, h11.Request):
                head = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage) and head is not None:
                return Received(at=time.time(), method=head.method.decode(),
                                path=head.target.decode(),
                                headers={name.decode().lower(): value.decode()
                                         for name, value in head.headers},
                                body=bytes(body))
            elif isinstance(event, h11.ConnectionClosed):
                return None


@asynccontextmanager
async def running_receiver(respond: Respond | None = None) -> AsyncIterator[Receiver]:
    """A receiver listening on 127.0.0.1 (a free port) until the block ends."""
    receiver = Receiver(respond)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(
            partial(trio.serve_tcp, receiver.handle, 0, host="127.0.0.1"))
        receiver.port = listeners[0].socket.getsockname()[1]
        try:
            yield receiver
        finally:
            nursery.cancel_scope.cancel()
