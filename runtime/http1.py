"""A small HTTP/1.1 connection pool over h11 and Trio, as an httpx transport.

httpx's own pool (httpcore) does bookkeeping on every request and every response close that
grows with the pool (it polls every pooled connection's socket and counts the idle ones by
listing them all) and sends a request's head and body in two writes; profiles of webhook
delivery and of the chain's JSON-RPC calls put that at about a third of the exchange
(docs/performance.md). Here idle connections wait per origin (scheme, host, port) in a
last-in-first-out stack, only the connection taken is checked, and the head goes out in one
write with a body that is in memory or small.

The owner gives the function that opens TCP connections (``runtime.outbound`` connects only
to the addresses it vetted); TLS is set up here, verified against the URL's host. HTTP/1.1
only: no proxies, no HTTP/2.
"""

from __future__ import annotations

import select
import ssl
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from functools import cache
from typing import Any

import h11
import httpx
import trio

Connect = Callable[[str, int], Awaitable[trio.SocketStream]]
"""Opens a TCP connection to (host, port); raises OSError (or ``httpx.ConnectError``)."""

Origin = tuple[str, str, int]  # scheme, host, port

# A request body of known length up to this size is read before sending, to go out in one
# write with the head; a longer one (or one of unknown length) is streamed after the head.
ONE_WRITE_MAX_BYTES = 64 * 1024
RECEIVE_MAX_BYTES = 64 * 1024
_DEFAULT_PORTS = {"http": 80, "https": 443}


async def open_tcp(host: str, port: int) -> trio.SocketStream:
    """The default ``Connect``: the host's addresses from DNS, tried as Trio does."""
    return await trio.open_tcp_stream(host, port)


class _Stale(Exception):
    """A kept-alive connection failed before any byte of the response arrived: the peer had
    closed it (its idle timeout raced ours). The request may go again on a new connection."""


class _Connection:
    """One open connection (plain or TLS) and its h11 state."""

    __slots__ = ("expires_at", "origin", "protocol", "socket", "stream")

    def __init__(self, origin: Origin, stream: trio.abc.Stream, socket: trio.socket.SocketType
                 ) -> None:
        self.origin = origin
        self.stream = stream
        self.socket = socket  # the TCP socket under TLS too: what the readability check polls
        self.protocol = h11.Connection(h11.CLIENT)
        self.expires_at = 0.0

    def untouched(self) -> bool:
        """Whether nothing arrived since the last response: an idle connection's socket is
        readable when the peer closed it or sent bytes no request asked for; either way it
        cannot carry another exchange."""
        poller = select.poll()
        poller.register(self.socket, select.POLLIN)
        return not poller.poll(0)

    def close(self) -> None:
        """Close at once (no TLS close_notify): a connection is only ever discarded."""
        self.socket.close()


@contextmanager
def _within(seconds: float | None) -> Iterator[None]:
    """Raise ``trio.TooSlowError`` if the block takes longer than ``seconds`` (None: no limit)."""
    with trio.fail_after(seconds) if seconds is not None else nullcontext():
        yield


@cache
def default_tls_context() -> ssl.SSLContext:
    """httpx's TLS context (verifying against certifi's CAs), made once per process: making
    one parses the CA file (20-50 ms of CPU), which every client, and so every ``fetch_url``
    call, paid before."""
    return httpx.create_ssl_context()


class Http1Transport(httpx.AsyncBaseTransport):
    """HTTP/1.1 over connections kept alive per origin.

    :param max_connections: requests under way at once (each holds one connection until its
        response body is read or closed); as many more may wait idle, and a connection
        returned beyond that is closed.
    :param keepalive_expiry: seconds an idle connection is kept.
    :param connect: opens TCP connections (default: DNS, then the first address that answers).
    :param ssl_context: for https (default: :func:`default_tls_context`).
    """

    def __init__(self, *, max_connections: int, keepalive_expiry: float = 30.0,
                 connect: Connect = open_tcp, ssl_context: ssl.SSLContext | None = None
                 ) -> None:
        self._connect = connect
        self._ssl_context = ssl_context or default_tls_context()
        self._keepalive_expiry = keepalive_expiry
        self._max_idle = max_connections
        self._slots = trio.Semaphore(max_connections)
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._idle_count = 0
        self._next_sweep = 0.0
        self._closed = False

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and return its response with the body still to read (a stream
        that hands the connection back once read to its end, and closes it otherwise).

        :raises httpx.TimeoutException: pool, connect, write or read timeout.
        :raises httpx.TransportError: connect failure, network or protocol error.
        """
        timeouts: Mapping[str, float | None] = request.extensions.get("timeout", {})
        url = request.url
        scheme = url.scheme
        if scheme not in _DEFAULT_PORTS:
            raise httpx.UnsupportedProtocol(f"scheme {scheme!r} is not http or https")
        origin = (scheme, url.raw_host.decode("ascii"), url.port or _DEFAULT_PORTS[scheme])
        body = await _body_in_memory(request)
        await self._take_slot(timeouts.get("pool"))
        try:
            return await self._send(origin, request, body, timeouts)
        except BaseException:
            self._slots.release()
            raise

    async def _send(self, origin: Origin, request: httpx.Request, body: bytes | None,
                    timeouts: Mapping[str, float | None]) -> httpx.Response:
        connection = self._take_idle(origin)
        if connection is not None:
            try:
                return await self._exchange(connection, request, body, timeouts,
                                            retry_if_stale=body is not None)
            except _Stale:
                # Sending again is safe: the peer answered nothing, so nothing of a response
                # was read or acted on here, and the receivers of what goes out through here
                # tolerate a repeat anyway (webhook receivers dedupe by delivery id; JSON-RPC
                # eth_call and the indexer's reads are read-only). A streamed body is not
                # kept, so only a body in memory goes again.
                pass
        connection = await self._open(origin, timeouts.get("connect"))
        return await self._exchange(connection, request, body, timeouts, retry_if_stale=False)

    async def _take_slot(self, timeout: float | None) -> None:
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            try:
                with _within(timeout):
                    await self._slots.acquire()
            except trio.TooSlowError:
                raise httpx.PoolTimeout(f"no connection free within {timeout:g} s") from None

    def _take_idle(self, origin: Origin) -> _Connection | None:
        now = trio.current_time()
        if now >= self._next_sweep:
            self._sweep(now)
        stack = self._idle.get(origin)
        while stack:
            connection = stack.pop()
            self._idle_count -= 1
            if connection.expires_at > now and connection.untouched():
                return connection
            connection.close()
        return None

    def _sweep(self, now: float) -> None:
        """Close the expired idle connections of every origin (those of an origin no longer
        asked for would otherwise stay open): once per keep-alive period, not per request."""
        for origin, stack in list(self._idle.items()):
            while stack and stack[0].expires_at <= now:  # oldest first
                stack.popleft().close()
                self._idle_count -= 1
            if not stack:
                del self._idle[origin]
        self._next_sweep = now + self._keepalive_expiry

    async def _open(self, origin: Origin, timeout: float | None) -> _Connection:
        scheme, host, port = origin
        try:
            with _within(timeout):
                tcp = await self._connect(host, port)
                if scheme == "http":
                    return _Connection(origin, tcp, tcp.socket)
                tls = trio.SSLStream(tcp, self._ssl_context, server_hostname=host,
                                     https_compatible=True)
                try:
                    await tls.do_handshake()
                except BaseException:
                    tcp.socket.close()
                    raise
                return _Connection(origin, tls, tcp.socket)
        except trio.TooSlowError:
            raise httpx.ConnectTimeout(f"no connection within {timeout:g} s") from None
        except trio.BrokenResourceError as exc:  # TLS: the cause says what failed
            raise httpx.ConnectError(str(exc.__cause__ or exc)) from exc
        except OSError as exc:
            raise httpx.ConnectError(str(exc) or type(exc).__name__) from exc

    async def _exchange(self, connection: _Connection, request: httpx.Request,
                        body: bytes | None, timeouts: Mapping[str, float | None], *,
                        retry_if_stale: bool) -> httpx.Response:
        """Send the request and read the response's head; the body is read by the caller
        through the response's stream. The connection is closed on any failure.

        :raises _Stale: ``retry_if_stale`` and the connection failed before any response byte.
        """
        try:
            try:
                await _send_request(connection, request, body, timeouts.get("write"))
                head = await _receive_head(connection, timeouts.get("read"))
            except _Stale as stale:
                if retry_if_stale:
                    raise
                raise stale.__cause__ or httpx.RemoteProtocolError(
                    "the server closed the connection without answering") from None
        except BaseException:
            connection.close()
            raise
        return httpx.Response(
            status_code=head.status_code, headers=head.headers.raw_items(),
            stream=_ResponseBody(self, connection, timeouts.get("read")),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": head.reason})

    def _release(self, connection: _Connection, *, complete: bool) -> None:
        """Take back the connection of a closed response: kept idle if its response was read
        to the end and both sides allow another exchange, closed otherwise."""
        protocol = connection.protocol
        if complete and not self._closed and self._idle_count < self._max_idle and \
                protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
            protocol.start_next_cycle()
            connection.expires_at = trio.current_time() + self._keepalive_expiry
            self._idle.setdefault(connection.origin, deque()).append(connection)
            self._idle_count += 1
        else:
            connection.close()
        self._slots.release()

    async def aclose(self) -> None:
        """Close the idle connections; those in use close when their response does."""
        self._closed = True
        for stack in self._idle.values():
            for connection in stack:
                connection.close()
        self._idle.clear()
        self._idle_count = 0


class _ResponseBody(httpx.AsyncByteStream):
    """The body of one response, read from its connection as the caller iterates (not an
    async generator: a caller that stops early must not leave one unfinished)."""

    def __init__(self, transport: Http1Transport, connection: _Connection,
                 read_timeout: float | None) -> None:
        self._transport = transport
        self._connection = connection
        self._read_timeout = read_timeout
        self._complete = False
        self._closed = False

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self

    async def __anext__(self) -> bytes:
        if self._closed:
            raise httpx.StreamClosed()
        try:
            while not self._complete:
                event = await _next_event(self._connection, self._read_timeout)
                if isinstance(event, h11.Data):
                    return bytes(event.data)
                if not isinstance(event, h11.EndOfMessage):
                    raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")
                self._complete = True
        except BaseException:
            await self.aclose()
            raise
        raise StopAsyncIteration

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport._release(self._connection, complete=self._complete)


async def _body_in_memory(request: httpx.Request) -> bytes | None:
    """The request's whole body if it is in memory or of a known length small enough to
    read first; None for a body to stream after the head."""
    stream = request.stream
    if isinstance(stream, httpx.ByteStream):
        return b"".join(stream)
    try:
        length = int(request.headers.get("content-length", "-1"))
    except ValueError:
        return None
    if not 0 <= length <= ONE_WRITE_MAX_BYTES:
        return None
    assert isinstance(stream, httpx.AsyncByteStream)
    return b"".join([chunk async for chunk in stream])


async def _send_request(connection: _Connection, request: httpx.Request, body: bytes | None,
                        timeout: float | None) -> None:
    try:
        await _send_events(connection, request, body, timeout)
    except h11.LocalProtocolError as exc:  # a bad header, or a body unlike its length
        raise httpx.LocalProtocolError(str(exc)) from exc


async def _send_events(connection: _Connection, request: httpx.Request, body: bytes | None,
                       timeout: float | None) -> None:
    protocol = connection.protocol
    head = protocol.send(h11.Request(method=request.method, target=request.url.raw_path,
                                     headers=request.headers.raw)) or b""
    if body is not None:
        data = (protocol.send(h11.Data(data=body)) or b"") if body else b""
        end = protocol.send(h11.EndOfMessage()) or b""
        await _write(connection, head + data + end, timeout, stale_if_broken=True)
        return
    await _write(connection, head, timeout, stale_if_broken=False)
    assert isinstance(request.stream, httpx.AsyncByteStream)
    async for chunk in request.stream:
        if chunk:
            await _write(connection, protocol.send(h11.Data(data=chunk)) or b"", timeout,
                         stale_if_broken=False)
    await _write(connection, protocol.send(h11.EndOfMessage()) or b"", timeout,
                 stale_if_broken=False)


async def _write(connection: _Connection, data: bytes, timeout: float | None, *,
                 stale_if_broken: bool) -> None:
    try:
        with _within(timeout):
            await connection.stream.send_all(data)
    except trio.TooSlowError:
        raise httpx.WriteTimeout(f"could not send within {timeout:g} s") from None
    except (trio.BrokenResourceError, OSError) as exc:
        error = httpx.WriteError(str(exc.__cause__ or exc) or type(exc).__name__)
        if stale_if_broken:
            raise _Stale() from error
        raise error from exc


async def _receive_head(connection: _Connection, timeout: float | None) -> h11.Response:
    protocol = connection.protocol
    event = protocol.next_event()
    if event is h11.NEED_DATA:  # as always on a new cycle: the first bytes tell a stale peer
        try:
            data = await _receive(connection, timeout)
        except httpx.ReadError as exc:
            raise _Stale() from exc
        if not data:
            raise _Stale() from httpx.RemoteProtocolError(
                "the server closed the connection without answering")
        protocol.receive_data(data)
        event = await _next_event(connection, timeout)
    while not isinstance(event, h11.Response):
        if not isinstance(event, h11.InformationalResponse):  # 1xx: the answer follows
            raise httpx.RemoteProtocolError(f"unexpected {type(event).__name__}")
        event = await _next_event(connection, timeout)
    return event


async def _next_event(connection: _Connection, timeout: float | None) -> Any:
    """The next h11 event of the response, receiving as needed."""
    protocol = connection.protocol
    try:
        while True:
            event = protocol.next_event()
            if event is not h11.NEED_DATA:
                return event
            protocol.receive_data(await _receive(connection, timeout))
    except h11.RemoteProtocolError as exc:
        raise httpx.RemoteProtocolError(str(exc)) from exc


async def _receive(connection: _Connection, timeout: float | None) -> bytes:
    try:
        with _within(timeout):
            data = await connection.stream.receive_some(RECEIVE_MAX_BYTES)
        return data if isinstance(data, bytes) else bytes(data)  # TLS gives a bytearray
    except trio.TooSlowError:
        raise httpx.ReadTimeout(f"no data within {timeout:g} s") from None
    except (trio.BrokenResourceError, OSError) as exc:
        raise httpx.ReadError(str(exc.__cause__ or exc) or type(exc).__name__) from exc
