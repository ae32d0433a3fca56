"""The HTTP/1.1 pool (``runtime.http1``) against real servers on loopback: a raw HTTP/1.1
server written here, whose answers each test scripts byte for byte, and which counts the
connections it accepts and notices those the client closes."""

from __future__ import annotations

import ipaddress
import ssl
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from runtime import outbound
from runtime.http1 import Connect, Http1Transport, open_tcp

LOOPBACK = [ipaddress.ip_address("127.0.0.1")]


@dataclass(frozen=True)
class Request:
    """One request as the server read it; ``connection`` numbers the accepted connections
    from 1."""

    connection: int
    head: bytes
    body: bytes


Answer = Callable[[Request, trio.abc.Stream], Awaitable[bool]]
"""Answers one request on its stream; returns whether to read the next one (else the server
closes the connection)."""


def reply(body: bytes = b"ok", *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", f"Content-Length: {len(body)}", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


async def keep_alive(request: Request, stream: trio.abc.Stream) -> bool:
    await stream.send_all(reply())
    return True


class Server:
    """Serves ``answer`` on each request; records requests, accepts, and the connections
    that ended (the client closed them, or the answer did)."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None) -> None:
        self.answer = answer
        self.tls = tls
        self.port = 0
        self.accepts = 0
        self.requests: list[Request] = []
        self.ended: set[int] = set()
        self.changed = trio.Event()

    def url(self, path: str = "/", host: str = "127.0.0.1") -> str:
        return f"{'https' if self.tls else 'http'}://{host}:{self.port}{path}"

    async def wait_until(self, condition: Callable[[], bool]) -> None:
        with trio.fail_after(10):
            while not condition():
                self.changed = trio.Event()
                await self.changed.wait()

    async def handle(self, tcp: trio.SocketStream) -> None:
        self.accepts += 1
        number = self.accepts
        stream: trio.abc.Stream = tcp
        try:
            if self.tls is not None:
                stream = trio.SSLStream(tcp, self.tls, server_side=True)
                await stream.do_handshake()
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = await stream.receive_some(65536)
                    if not data:
                        return
                    buffer += data
                head, buffer = buffer.split(b"\r\n\r\n", 1)
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                if b"transfer-encoding: chunked" in head.lower():  # kept raw, up to its end
                    while b"0\r\n\r\n" not in buffer:
                        buffer += await stream.receive_some(65536)
                    length = buffer.index(b"0\r\n\r\n") + 5
                while len(buffer) < length:
                    buffer += await stream.receive_some(65536)
                request = Request(number, head, buffer[:length])
                buffer = buffer[length:]
                self.requests.append(request)
                self.changed.set()
                if not await self.answer(request, stream):
                    return
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await trio.aclose_forcefully(stream)
            self.ended.add(number)
            self.changed.set()


@asynccontextmanager
async def serving(answer: Answer, tls: ssl.SSLContext | None = None
                  ) -> AsyncIterator[Server]:
    server = Server(answer, tls)
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, server.handle, 0,
                                                 host="127.0.0.1"))
        server.port = listener.socket.getsockname()[1]
        yield server
        nursery.cancel_scope.cancel()


def client(max_connections: int = 4, timeout: float = 10.0, keepalive_expiry: float = 30.0,
           connect: Connect = open_tcp, ssl_context: ssl.SSLContext | None = None
           ) -> httpx.AsyncClient:
    transport = Http1Transport(max_connections=max_connections,
                               keepalive_expiry=keepalive_expiry, connect=connect,
                               ssl_context=ssl_context)
    return httpx.AsyncClient(transport=transport, timeout=timeout)


async def test_a_kept_alive_connection_serves_the_next_request() -> None:
    async with serving(keep_alive) as server, client() as http:
        first = await http.post(server.url("/one"), content=b"first body")
        second = await http.get(server.url("/two"))
    assert (first.status_code, first.content, second.content) == (200, b"ok", b"ok")
    assert server.accepts == 1
    assert [request.body for request in server.requests] == [b"first body", b""]


async def test_head_and_small_body_arrive_together() -> None:
    """The request goes out in one write: the server's first read holds head and body."""
    reads: list[bytes] = []

    async def first_read(tcp: trio.SocketStream) -> None:
        reads.append(await tcp.receive_some(65536))
        await tcp.send_all(reply(b"", "Connection: close"))
        await tcp.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, first_read, 0,
                                                 host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        async with client() as http:
            await http.post(f"http://127.0.0.1:{port}/hook", content=b'{"a": 1}')
        nursery.cancel_scope.cancel()
    [read] = reads
    assert read.startswith(b"POST /hook HTTP/1.1\r\n") and read.endswith(b'\r\n\r\n{"a": 1}')


async def test_a_connection_the_peer_closed_while_idle_is_not_reused() -> None:
    async def answer_then_close(request: Request, stream: trio.abc.Stream) -> bool:
        await stream.send_all(reply())  # no "Connection: close": the client cannot know
        return False

    async def streamed() -> AsyncIterator[bytes]:
        yield b"a body of unknown length, which is not sent twice"

    async with serving(answer_then_close) as server, client() as http:
        await http.get(server.url())
        await server.wait_until(lambda: 1 in server.ended)
        await trio.sleep(0.05)  # the FIN crosses loopback
        # Streamed, so that only the check of the connection taken can save the request.
        second = await http.post(server.url(), content=streamed())
    assert second.content == b"ok"
    assert server.accepts == 2
    assert [request.connection for request in server.requests] == [1, 2]


async def test_a_request_the_peer_dropped_on_a_kept_connection_goes_again_on_a_new_one(
        ) -> None:
    """The peer closes a kept-alive connection as the next request arrives, answering
    nothing (its idle timeout racing ours): the request is sent once more, on a new one."""
    async def drop_the_second(request: Request, stream: trio.abc.Stream) -> bool:
        if request.connection == 1 and len(server.requests) == 2:
            return False
        await stream.send_all(reply())
        return True

    async with serving(drop_the_second) as server, client() as http:
        await http.get(server.url())
        second = await http.post(server.url(), content=b"delivery 2")
    assert second.content == b"ok"
    assert [(request.connection, request.body) for request in server.requests] == [
        (1, b""), (1, b"delivery 2"), (2, b"delivery 2")]


async def test_a_new_connection_that_closes_unanswered_is_an_error_not_a_retry() -> None:
    async def drop(request: Request, stream: trio.abc.Stream) -> bool:
        return False

    async with serving(drop) as server, client() as http:
        with pytest.raises(httpx.RemoteProtocolError):
            await http.post(server.url(), content=b"once")
    assert len(server.requests) == 1


async def test_a_response_with_connection_close_is_not_pooled() -> None:
    async def close_header(request: Request, stream: trio.abc.Stream) -> bool:
        await stream.send_all(reply(b"ok", "Connection: close"))
        return True  # the client is the one to close (the server's next read sees it)

    async with serving(close_header) as server, client() as http:
        await http.get(server.url())
        await server.wait_until(lambda: 1 in server.ended)
        await http.get(server.url())
    assert server.accepts == 2


async def test_a_body_not_read_to_its_end_closes_the_connection() -> None:
    async def long_body(request: Request, stream: trio.abc.Stream) -> bool:
        if request.connection == 1:
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\nstart")
        else:
            await stream.send_all(reply())
        return True

    async with serving(long_body) as server, client() as http:
        async with http.stream("GET", server.url()) as response:
            with trio.CancelScope() as reading:  # (a break would leave httpx's generators open)
                async for chunk in response.aiter_raw():
                    assert chunk == b"start"
                    reading.cancel()
        await server.wait_until(lambda: 1 in server.ended)
        again = await http.get(server.url())
    assert again.content == b"ok" and server.accepts == 2


async def test_a_read_cancelled_half_way_closes_the_connection() -> None:
    async def stall(request: Request, stream: trio.abc.Stream) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhalf")
        return True

    async with serving(stall) as server, client() as http:
        with trio.move_on_after(0.5):
            await http.get(server.url())
        await server.wait_until(lambda: 1 in server.ended)


async def test_a_server_that_never_answers_times_out() -> None:
    async def never(request: Request, stream: trio.abc.Stream) -> bool:
        return True  # and wait for the next request, or the client's close

    async with serving(never) as server, client(timeout=0.5) as http:
        started = trio.current_time()
        with pytest.raises(httpx.TimeoutException):
            await http.get(server.url())
        assert trio.current_time() - started < 5  # 0.5 s, with room for a loaded machine
        await server.wait_until(lambda: 1 in server.ended)


async def test_a_chunked_body_is_read_whole_and_the_connection_kept() -> None:
    async def chunked(request: Request, stream: trio.abc.Stream) -> bool:
        await stream.send_all(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                              b"5\r\nhello\r\n")
        await trio.sleep(0.01)
        await stream.send_all(b"1\r\n \r\n5\r\nworld\r\n0\r\n\r\n")
        return True

    async with serving(chunked) as server, client() as http:
        first = await http.get(server.url())
        second = await http.get(server.url())
    assert first.content == second.content == b"hello world"
    assert server.accepts == 1


async def test_an_idle_connection_past_its_expiry_is_not_reused(
        mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 1.0  # a stall fails the test's waits rather than hang
    async with serving(keep_alive) as server, client(keepalive_expiry=30.0) as http:
        await http.get(server.url())
        mock_clock.jump(29)
        await http.get(server.url())
        mock_clock.jump(31)
        await http.get(server.url())
        await server.wait_until(lambda: 1 in server.ended)  # closed, not only left aside
    assert [request.connection for request in server.requests] == [1, 1, 2]


async def test_expired_connections_of_a_host_no_longer_asked_are_closed_too(
        mock_clock: trio.testing.MockClock) -> None:
    mock_clock.autojump_threshold = 1.0
    async with serving(keep_alive) as left, serving(keep_alive) as asked, \
            client(keepalive_expiry=30.0) as http:
        await http.get(left.url())
        await http.get(asked.url())
        mock_clock.jump(31)
        await http.get(asked.url())  # its own connection expired, and the other host's
        await left.wait_until(lambda: 1 in left.ended)


async def test_max_connections_bounds_the_requests_under_way() -> None:
    release = trio.Event()
    in_flight = 0
    most = 0

    async def held(request: Request, stream: trio.abc.Stream) -> bool:
        nonlocal in_flight, most
        in_flight += 1
        most = max(most, in_flight)
        await release.wait()
        in_flight -= 1
        await stream.send_all(reply())
        return True

    async with serving(held) as server, client(max_connections=2) as http:
        async with trio.open_nursery() as nursery:
            for _ in range(5):
                nursery.start_soon(http.get, server.url())
            await server.wait_until(lambda: len(server.requests) == 2)
            await trio.sleep(0.3)  # room for a third to arrive, were it sent
            assert len(server.requests) == 2
            release.set()
    assert most == 2 and len(server.requests) == 5
    assert server.accepts == 2  # the other three went over the two kept connections


# TLS: a certificate made here for one name, the server reached at 127.0.0.1 under it.
TLS_NAME = "hooks.example.test"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    directory = tmp_path_factory.mktemp("tls")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1", "-subj",
                    f"/CN={TLS_NAME}", "-addext", f"subjectAltName=DNS:{TLS_NAME}",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def server_tls(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*certificate)
    return context


async def to_loopback(host: str, port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream("127.0.0.1", port)


async def test_tls_is_verified_against_the_url_host(certificate: tuple[Path, Path]) -> None:
    trusting = ssl.create_default_context(cafile=str(certificate[0]))
    async with serving(keep_alive, server_tls(certificate)) as server:
        async with client(connect=to_loopback, ssl_context=trusting) as http:
            first = await http.get(server.url(host=TLS_NAME))
            second = await http.get(server.url(host=TLS_NAME))
            with pytest.raises(httpx.ConnectError, match="match|mismatch"):
                await http.get(server.url(host="other.example.test"))
        # The outbound client (the usual CAs, which do not know this one) refuses it.
        async with outbound.open_client(max_connections=2, timeout=10, user_agent="t") as http:
            with outbound.pinned(TLS_NAME, LOOPBACK), \
                    pytest.raises(httpx.ConnectError, match="certificate verify failed"):
                await http.get(server.url(host=TLS_NAME))
    assert first.content == second.content == b"ok"
    assert server.accepts == 3  # one kept for two requests, then one refused per client


async def test_the_pinned_transport_connects_only_to_the_pinned_addresses() -> None:
    async with serving(keep_alive) as server, \
            outbound.open_client(max_connections=2, timeout=10, user_agent="test") as http:
        with pytest.raises(httpx.ConnectError, match="not vetted"):
            await http.get(server.url(host="pinned.example.test"))
        with outbound.pinned("pinned.example.test", LOOPBACK):
            answer = await http.get(server.url(host="pinned.example.test"))
            with pytest.raises(httpx.ConnectError, match="not vetted"):
                await http.get(server.url(host="other.example.test"))
    assert answer.content == b"ok" and server.accepts == 1
    assert b"host: pinned.example.test" in server.requests[0].head.lower()


async def test_a_request_waiting_for_a_connection_past_the_pool_timeout_gives_up() -> None:
    release = trio.Event()

    async def held(request: Request, stream: trio.abc.Stream) -> bool:
        await release.wait()
        await stream.send_all(reply())
        return True

    async with serving(held) as server, client(max_connections=1) as http:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(http.get, server.url())
            await server.wait_until(lambda: len(server.requests) == 1)
            with pytest.raises(httpx.PoolTimeout):
                await http.get(server.url(), timeout=httpx.Timeout(10, pool=0.2))
            release.set()
        after = await http.get(server.url())  # the slot came back with the first response
    assert after.content == b"ok" and len(server.requests) == 2
