"""Accepting connections: the descriptor limit, a connection cap, and hypercorn's Trio worker.

hypercorn's ``serve`` (``hypercorn.trio.run.worker_serve``, 0.18) accepts every connection
it can; at the descriptor limit ``accept`` fails with ``EMFILE`` and Trio retries it in a loop,
so idle clients that hold descriptors take the service off the air for everyone. Here:

- ``raise_descriptor_limit`` raises the soft limit to the hard limit when the service starts;
- ``serve_http`` is hypercorn's Trio worker (lifespan, listeners, graceful shutdown, one
  ``TCPServer`` per connection, exactly as ``worker_serve`` runs them, for plain HTTP) with a
  ``ConnectionGate`` in front of each connection: past ``service.max_connections`` open
  connections a new one gets an immediate 503 ``unavailable`` with ``Retry-After`` and is
  closed, without touching the app. The cap stays ``RESERVED_DESCRIPTORS`` under the
  descriptor limit, which leaves room for the database pool, Redis, files and that refusal.
"""

from __future__ import annotations

import json
import logging
import resource
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, cast

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr

from runtime.errors import Unavailable

log = logging.getLogger("flowsvc.server")

RESERVED_DESCRIPTORS = 256
"""Descriptors kept out of the connection cap: database and Redis connections, log and
workspace files, subprocess pipes, and the connections being refused."""
REFUSAL_SECONDS = 2.0
"""How long a refused connection may take to read its answer before it is closed."""
_CONNECTION: ContextVar[_EndsWithTheClient] = ContextVar("flowsvc_connection")
_UNLIMITED = 1 << 20  # an unlimited hard limit: the most Linux allows by default (nr_open)


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit of open descriptors to its hard limit.

    :return: the soft limit now in force (unchanged when it cannot be raised).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _UNLIMITED if hard == resource.RLIM_INFINITY else hard
    if soft != resource.RLIM_INFINITY and target > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-descriptor limit from %d to %d: %s",
                        soft, target, exc)
            return soft
        return target
    return _UNLIMITED if soft == resource.RLIM_INFINITY else soft


def connection_cap(max_connections: int, descriptor_limit: int) -> int:
    """The connection cap in force: ``max_connections`` (0: as many as fit) kept
    ``RESERVED_DESCRIPTORS`` under ``descriptor_limit``."""
    room = max(1, descriptor_limit - RESERVED_DESCRIPTORS)
    if max_connections > room:
        log.warning("service.max_connections = %d does not fit under the descriptor limit "
                    "(%d); the cap is %d", max_connections, descriptor_limit, room)
    return room if max_connections == 0 else min(max_connections, room)


def _refusal() -> bytes:
    error = Unavailable("the service is at its connection limit; retry shortly")
    body = json.dumps(error.body(), separators=(",", ":")).encode()
    head = (f"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nretry-after: {error.headers['Retry-After']}\r\n"
            "connection: close\r\n\r\n")
    return head.encode() + body


class ConnectionGate:
    """Counts open connections and refuses those past ``limit``.

    :param limit: the most connections served at once.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.open = 0
        self.refused = 0
        self._refusal = _refusal()

    async def handle(self, serve: Callable[[trio.SocketStream], Awaitable[None]],
                     stream: trio.SocketStream) -> None:
        """Serve ``stream`` with ``serve``, or refuse it when ``limit`` are open already.
        The caller (``trio.serve_listeners``) closes the stream afterwards."""
        if self.open >= self.limit:
            self.refused += 1
            await self._refuse(stream)
            return
        self.open += 1
        try:
            with trio.CancelScope() as scope:
                connection = _EndsWithTheClient(stream, scope)
                _CONNECTION.set(connection)  # hypercorn starts the app's tasks from this one
                await serve(cast(trio.SocketStream, connection))
        finally:
            self.open -= 1

    async def _refuse(self, stream: trio.SocketStream) -> None:
        with trio.move_on_after(REFUSAL_SECONDS):
            try:
                await stream.send_all(self._refusal)
                await stream.send_eof()
                # Read what the client sends until it closes: closing with unread bytes
                # would reset the connection, and the client could lose the answer.
                while await stream.receive_some(65536):
                    pass
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass


@asynccontextmanager
async def closing_answer() -> AsyncIterator[None]:
    """Around the writing of an answer after which the connection closes and nothing more may
    be read from it (what follows the request must not be parsed). hypercorn's reader fails
    on bytes already behind such a request and closes the connection at once, which would
    cut the answer short: a close from any other task waits until the answer is written
    (at most ``ANSWER_SECONDS``). Does nothing outside ``serve_http``."""
    connection = _CONNECTION.get(None)
    if connection is None:
        yield
        return
    connection.done_reading = True
    connection.answering = trio.lowlevel.current_task()
    connection.answered = trio.Event()
    try:
        yield
    finally:
        connection.answered.set()


ANSWER_SECONDS = 5.0
"""The longest a close waits for a ``closing_answer`` to be written."""
CLIENT_GONE_SECONDS = 1.0
"""How long hypercorn gets to wind a connection up after its client closed it."""


class _EndsWithTheClient:
    """A connection's stream that ends the connection soon after the client closes it.

    hypercorn's ``TCPServer`` stops reading at the end of the stream but keeps the
    connection (and its descriptor) until its keep-alive idle timer runs out, up to
    ``service.keep_alive_timeout_seconds`` later. Here the connection is cancelled
    ``CLIENT_GONE_SECONDS`` after the client's end; hypercorn treats that end as a close
    anyway (the request in flight, if any, hears ``http.disconnect``).

    :param stream: the accepted stream; ``TCPServer`` uses only these methods and ``socket``.
    :param scope: the connection's cancel scope.
    """

    def __init__(self, stream: trio.SocketStream, scope: trio.CancelScope) -> None:
        self._stream = stream
        self._scope = scope
        self._sending = trio.Lock()
        self.socket = stream.socket
        self.done_reading = False
        self._closed = trio.Event()
        self.answering: trio.lowlevel.Task | None = None
        self.answered = trio.Event()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self.done_reading:
            await self._closed.wait()
            raise trio.ClosedResourceError
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self._client_gone()
            raise
        if not data:
            self._client_gone()
        elif self.done_reading:  # what follows a closing answer is not for hypercorn
            await self._closed.wait()
            raise trio.ClosedResourceError
        return data

    def _client_gone(self) -> None:
        self._scope.deadline = min(self._scope.deadline,
                                   trio.current_time() + CLIENT_GONE_SECONDS)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        async with self._sending:
            await self._stream.send_all(data)

    async def send_eof(self) -> None:
        # hypercorn closes (send_eof, then aclose) from its reader too: that close must not
        # interrupt an answer being written (trio would raise BusyResourceError, or the
        # socket would be gone), so it waits for the write, and for a closing answer.
        if self.answering is not None and self.answering is not trio.lowlevel.current_task():
            with trio.move_on_after(ANSWER_SECONDS):
                await self.answered.wait()
        async with self._sending:
            await self._stream.send_eof()

    async def aclose(self) -> None:
        self._closed.set()
        await self._stream.aclose()


async def serve_http(app: ASGIFramework, config: HypercornConfig, gate: ConnectionGate, *,
                     shutdown_trigger: Callable[[], Awaitable[None]],
                     task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED
                     ) -> None:
    """Serve ``app`` on ``config.bind`` (plain HTTP) until ``shutdown_trigger`` returns, each
    connection through ``gate``; then stop accepting and give open connections
    ``config.graceful_timeout``. Hands the bound URLs to ``task_status.started``."""
    wrapped = ASGIWrapper(app)
    state: LifespanState = {}
    lifespan = Lifespan(wrapped, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            listeners: list[Any] = []
            binds: list[str] = []
            for sock in config.create_sockets().insecure_sockets:
                sock.listen(config.backlog)
                listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
                binds.append(f"http://{repr_socket_addr(sock.family, sock.getsockname())}")
            serve_one = cast(Callable[[trio.SocketStream], Awaitable[None]],
                             partial(TCPServer, wrapped, config, context,
                                     ConnectionState(state.copy())))
            task_status.started(binds)
            try:
                async with trio.open_nursery() as accepting:
                    accepting.start_soon(partial(trio.serve_listeners,
                                                 partial(gate.handle, serve_one), listeners,
                                                 handler_nursery=connections))
                    await shutdown_trigger()
                    accepting.cancel_scope.cancel()
            finally:
                # As hypercorn does: idle connections close at once, busy ones get the grace.
                await context.terminated.set()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
