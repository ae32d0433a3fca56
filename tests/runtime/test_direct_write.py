"""Direct writes of a streamed body (``runtime.direct_write``), through the real accept loop
(``serve_http``), the early-response guard and hypercorn, to a client parsing with h11.

These fail loudly when a hypercorn upgrade changes the objects the direct writer relies on:
the stream must then be served through ASGI (the fallback, tested here too) until the
module is brought up to date with the new hypercorn.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import h11
import trio
from hypercorn.config import Config as HypercornConfig
from quart import Response
from quart_trio import QuartTrio

from runtime.connections import ConnectionGate, serve_http
from runtime.direct_write import HYPERCORN_VERSION, direct_writer
from runtime.early_response import guard_early_responses
from runtime.metrics import Metrics

PIECES = [b"data: %d\n\n" % number for number in range(200)] + [b"x" * 300_000]
"""Many small pieces, then one larger than the socket's buffer (written in several goes)."""
HEAD = b"retry: 1000\n\n"
DEADLINE = 20


@asynccontextmanager
async def serving(direct: list[bool]) -> AsyncIterator[tuple[str, int]]:
    """A quart-trio app on ``serve_http`` whose ``/stream`` sends ``HEAD`` through ASGI, then
    ``PIECES`` through a direct writer when it gets one (noted in ``direct``)."""
    app = QuartTrio(__name__)

    @app.get("/stream")
    async def stream() -> Response:
        async def body() -> AsyncIterator[bytes]:
            yield HEAD
            writer = direct_writer()
            direct.append(writer is not None)
            for piece in PIECES:
                if writer is None:
                    yield piece
                else:
                    await writer.write(piece)

        response = Response(body(), content_type="text/event-stream")
        response.timeout = None
        return response

    @app.get("/after")
    async def after() -> str:
        return "still in step"

    config = HypercornConfig()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(lambda task_status: serve_http(
            guard_early_responses(app, max_drain_bytes=1024), config,
            ConnectionGate(10, 10.0, Metrics()), shutdown_trigger=stop.wait,
            task_status=task_status))
        host, port = binds[0].removeprefix("http://").rsplit(":", 1)
        yield host, int(port)
        stop.set()


async def exchange(client: h11.Connection, stream: trio.SocketStream, target: str
                   ) -> tuple[h11.Response, bytes]:
    """Send a GET for ``target`` and read its whole answer with h11."""
    await stream.send_all(client.send(h11.Request(
        method="GET", target=target, headers=[("Host", "flowsvc.test")])))
    await stream.send_all(client.send(h11.EndOfMessage()))
    response: h11.Response | None = None
    body = bytearray()
    with trio.fail_after(DEADLINE):
        while True:
            event = client.next_event()
            if event is h11.NEED_DATA:
                client.receive_data(await stream.receive_some(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                assert response is not None
                return response, bytes(body)


async def test_an_http11_stream_is_written_directly_in_correct_chunks() -> None:
    direct: list[bool] = []
    async with serving(direct) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        client = h11.Connection(h11.CLIENT)
        response, body = await exchange(client, stream, "/stream")
        assert direct == [True], (
            "no direct writer on HTTP/1.1 under serve_http: hypercorn's objects are not the "
            f"ones runtime/direct_write.py knows (written for hypercorn {HYPERCORN_VERSION}); "
            "see the warning it logged")
        assert response.status_code == 200
        assert (b"transfer-encoding", b"chunked") in response.headers
        assert body == HEAD + b"".join(PIECES)
        # The connection is in step: hypercorn ended the body and serves the next request.
        client.start_next_cycle()
        response, body = await exchange(client, stream, "/after")
        assert (response.status_code, body) == (200, b"still in step")
        await stream.aclose()


async def test_an_http10_stream_falls_back_to_asgi() -> None:
    direct: list[bool] = []
    async with serving(direct) as (host, port):
        stream = await trio.open_tcp_stream(host, port)
        await stream.send_all(b"GET /stream HTTP/1.0\r\nHost: flowsvc.test\r\n\r\n")
        received = bytearray()
        with trio.fail_after(DEADLINE):
            while chunk := await stream.receive_some(65536):
                received += chunk
        head, _, body = bytes(received).partition(b"\r\n\r\n")
        assert direct == [False]  # a body ended by the close, not chunked: no direct writes
        assert head.startswith(b"HTTP/1.1 200")
        assert body == HEAD + b"".join(PIECES)
        await stream.aclose()


def test_requirements_pin_the_hypercorn_the_direct_writer_knows() -> None:
    lock = (Path(__file__).parents[2] / "requirements.lock").read_text()
    pinned = re.search(r"(?m)^hypercorn==(\S+)", lock)
    assert pinned is not None and pinned.group(1) == HYPERCORN_VERSION, (
        "requirements.lock moves hypercorn: check runtime/direct_write.py against the new "
        "version's objects (HTTPStream, H11Protocol, TCPServer), then set HYPERCORN_VERSION")
