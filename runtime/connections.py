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
  descriptor limit, which leaves room for the database pool, Redis, files and that refusal;
- each connection is closed after ``service.keep_alive_timeout_seconds`` without a request
  in flight, and soon after its client closed it (``_Connection``);
- a request's code can reach its connection (``current_connection``): to reset it, or to
  write a streamed body straight to it (``runtime.direct_write``).
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import socket
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from functools import partial
from typing import Any, Protocol, cast

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ASGIFramework, ConnectionState, LifespanState
from hypercorn.utils import repr_socket_addr

from runtime.errors import Unavailable
from runtime.metrics import Metrics

log = logging.getLogger("flowsvc.server")

RESERVED_DESCRIPTORS = 256
"""Descriptors kept out of the connection cap: database and Redis connections, log and
workspace files, subprocess pipes, and the connections being refused."""
REFUSAL_SECONDS = 2.0
"""How long a refused connection may take to read its answer before it is closed."""
_CONNECTION: ContextVar[_Connection] = ContextVar("flowsvc_connection")
_UNLIMITED = 1 << 20  # an unlimited hard limit: the most Linux allows by default (nr_open)
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: the kernel drops unsent data


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
    """Counts open connections and refuses those past ``limit``; closes idle ones.

    :param limit: the most connections served at once.
    :param idle_seconds: how long a connection may stay without a request in flight
        (``service.keep_alive_timeout_seconds``).
    :param metrics: where open and refused connections are counted.
    """

    def __init__(self, limit: int, idle_seconds: float, metrics: Metrics) -> None:
        self.limit = limit
        self.idle_seconds = idle_seconds
        self._metrics = metrics
        self._connections: set[_Connection] = set()
        self._refusal = _refusal()
        self._closing = False

    async def handle(self, serve: Callable[[trio.SocketStream], Awaitable[None]],
                     stream: trio.SocketStream) -> None:
        """Serve ``stream`` with ``serve``, or refuse it when ``limit`` are open already.
        The caller (``trio.serve_listeners``) closes the stream afterwards."""
        if len(self._connections) >= self.limit:
            self._metrics.refused_connections.inc()
            await self._refuse(stream)
            return
        scope = trio.CancelScope()
        connection = _Connection(stream, scope, self.idle_seconds)
        connection.closing = self._closing
        _CONNECTION.set(connection)  # hypercorn starts the app's tasks from this task
        self._connections.add(connection)
        self._metrics.open_connections.inc()
        try:
            with scope:
                await serve(cast(trio.SocketStream, connection))
        finally:
            self._connections.discard(connection)
            self._metrics.open_connections.dec()

    def close_idle(self) -> None:
        """Close every connection without a request in flight, now and as soon as one
        becomes idle, and those accepted from now on after their first request (a drain,
        a shutdown: requests in flight get the grace period)."""
        self._closing = True
        for connection in self._connections:
            connection.closing = True
            connection.close_if_idle()

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


class ClientConnection(Protocol):
    """The connection a request arrived on, as its code may use it."""

    def reset(self) -> None:
        """End the connection at once, unsent data dropped (a TCP reset): a write blocked on
        it fails, and the server winds the request up as for any disconnect. Safe from any
        task, and more than once."""


def current_connection() -> ClientConnection | None:
    """The connection of the current request (None outside ``serve_http``)."""
    return _CONNECTION.get(None)


def request_began() -> int:
    """Mark the connection of the current request busy: no idle timeout while it is in
    flight. Returns the request's number on its connection, for ``request_ended``."""
    connection = _CONNECTION.get(None)
    return 0 if connection is None else connection.busy()


def request_ended(request: int) -> None:
    """Mark the connection of ``request`` idle, unless a later request has begun on it."""
    connection = _CONNECTION.get(None)
    if connection is not None:
        connection.idle(request)


class _Connection:
    """The stream of one connection, as hypercorn's ``TCPServer`` sees it, and its deadline.

    - *Idle timeout*: the connection's cancel scope has a deadline ``idle_seconds`` ahead
      whenever no request is in flight (from the accept, and after each answer), none while
      one is. hypercorn has a keep-alive timer of its own, but under quart-trio it never
      starts again after the first request (``runtime.early_response``), and restarting it
      costs a task per request; a deadline costs nothing.
    - *The client's close*: hypercorn stops reading at the end of the stream but keeps the
      connection until its timer runs out; here the connection ends ``CLIENT_GONE_SECONDS``
      after the client's end (hypercorn treats that end as a close anyway: a request in
      flight hears ``http.disconnect``).
    - *Closing answers*: see ``closing_answer``.

    :param stream: the accepted stream; ``TCPServer`` uses only these methods and ``socket``.
    :param scope: the connection's cancel scope.
    """

    def __init__(self, stream: trio.SocketStream, scope: trio.CancelScope,
                 idle_seconds: float) -> None:
        self._stream = stream
        self._scope = scope
        self._idle_seconds = idle_seconds
        self._requests = 0
        self._gone = False
        self._sending = trio.Lock()
        self._closed = trio.Event()
        self.socket = stream.socket
        self.done_reading = False
        self.closing = False  # the service is shutting down
        self.answering: trio.lowlevel.Task | None = None
        self.answered = trio.Event()
        scope.deadline = trio.current_time() + idle_seconds

    def busy(self) -> int:
        self._requests += 1
        if not self._gone:
            self._scope.deadline = math.inf
        return self._requests

    def idle(self, request: int) -> None:
        if request == self._requests and not self._gone:
            self._scope.deadline = trio.current_time() + self._idle_seconds
            if self.closing:
                self._scope.cancel()

    def close_if_idle(self) -> None:
        if self._scope.deadline != math.inf:  # no request in flight
            self._scope.cancel()

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
        self._gone = True
        self._scope.deadline = min(self._scope.deadline,
                                   trio.current_time() + CLIENT_GONE_SECONDS)

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        # The lock keeps other tasks' writes (``send_now``) and a close (``send_eof``) out of
        # this write; a free lock is taken without the scheduling round of ``async with``
        # (two of them a request: 3.4 % of a served /healthz's instructions, bench_pipeline).
        try:
            self._sending.acquire_nowait()
        except trio.WouldBlock:
            await self._sending.acquire()
        try:
            await self._stream.send_all(data)
        finally:
            self._sending.release()

    async def send_soon(self, data: bytes | memoryview) -> None:
        """``send_all`` without a checkpoint when the connection is free and the kernel takes
        all of ``data`` at once (the common case): no lock wait, no scheduling round.

        :raises trio.BrokenResourceError: the client is gone (or the connection was reset).
        :raises trio.ClosedResourceError: the connection is closed.
        """
        try:
            self._sending.acquire_nowait()
        except trio.WouldBlock:
            await self.send_all(data)
            return
        try:
            sent = self._write(data)
            if sent < len(data):
                await self._stream.send_all(memoryview(data)[sent:])
        finally:
            self._sending.release()

    def send_now(self, data: bytes) -> int:
        """Write what the kernel takes of ``data`` at once, without waiting (from any task).
        Returns how many bytes were written: 0 when the socket is full or another write holds
        the connection; a caller that wrote part of a message must write the rest before
        anything else (``send_all``).

        :raises trio.BrokenResourceError: the client is gone (or the connection was reset).
        :raises trio.ClosedResourceError: the connection is closed.
        """
        # No checkpoint from the test to the end of the write: no other task can take the
        # lock meanwhile, so this is the lock's exclusion without its cost.
        if self._sending.locked():
            return 0
        return self._write(data)

    def _write(self, data: bytes | memoryview) -> int:
        """One non-blocking ``os.write`` of ``data`` (the caller excludes other writes)."""
        descriptor = self.socket.fileno()
        if descriptor < 0:  # closed: the number may belong to another file by now
            raise trio.ClosedResourceError("the connection is closed")
        try:
            return os.write(descriptor, data)
        except BlockingIOError:
            return 0
        except OSError as exc:
            raise trio.BrokenResourceError(f"the client is gone: {exc}") from exc

    def reset(self) -> None:
        try:
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
            self.socket.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already gone

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
                # Idle connections close at once, busy ones get the grace period.
                await context.terminated.set()
                gate.close_idle()
                connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()
