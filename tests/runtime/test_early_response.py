"""The early-response guard alone, around an app that behaves like quart-trio.

A fake hypercorn queues the request body and, like hypercorn, tells the app
``http.disconnect`` inside the send of the last response message.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from runtime.early_response import guard_early_responses

Message = Any  # ASGI messages, as plain dicts
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
START = {"type": "http.response.start", "status": 401, "headers": [(b"content-length", b"2")]}


class FakeServer:
    """hypercorn's side of one request: queued body parts, and what the app sent.

    Like hypercorn, it tells the app ``http.disconnect`` inside the send of the last message,
    then recycles or closes the connection after a checkpoint (``finished``).
    """

    def __init__(self, headers: list[tuple[bytes, bytes]]) -> None:
        self.scope: Any = {"type": "http", "http_version": "1.1", "headers": headers}
        self.to_app, self.inbox = trio.open_memory_channel[Message](64)
        self.sent: list[Message] = []
        self.last_sent_at = -1.0
        self.finished = False

    async def receive(self) -> Message:
        return await self.inbox.receive()

    async def send(self, message: Message) -> None:
        self.sent.append(message)
        if message["type"] == "http.response.body" and not message.get("more_body"):
            self.last_sent_at = trio.current_time()
            self.to_app.send_nowait({"type": "http.disconnect"})
            await trio.sleep(0.1)
            self.finished = True

    def body(self, data: bytes, more: bool = True) -> None:
        self.to_app.send_nowait({"type": "http.request", "body": data, "more_body": more})


async def _quart_trio_like(scope: Any, receive: Receive, send: Send) -> None:
    """Answers 401 at once, and cancels its answer on ``http.disconnect``."""
    async with trio.open_nursery() as nursery:

        async def handle_messages() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            nursery.cancel_scope.cancel()

        nursery.start_soon(handle_messages)
        await send(START)
        await send({"type": "http.response.body", "body": b"no", "more_body": False})
        nursery.cancel_scope.cancel()


async def _serve_one(server: FakeServer, *, limit: int = 100, seconds: float = 5.0) -> float:
    """Run the guarded app for ``server``'s request; how long until the last message left."""
    guarded = guard_early_responses(_quart_trio_like, max_drain_bytes=limit,
                                    drain_seconds=seconds)
    started = trio.current_time()
    await guarded(server.scope, server.receive, server.send)
    return server.last_sent_at - started


async def test_guard_drains_the_rest_of_the_body_before_the_last_message(
        autojump_clock: trio.abc.Clock) -> None:
    server = FakeServer([(b"content-length", b"30")])
    server.body(b"x" * 10)

    async def client() -> None:
        await trio.sleep(1)
        server.body(b"x" * 10)
        await trio.sleep(1)
        server.body(b"x" * 10, more=False)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        assert await _serve_one(server) == pytest.approx(2)
    assert server.sent == [START, {"type": "http.response.body", "body": b"no",
                                   "more_body": False}]
    assert server.inbox.statistics().current_buffer_used == 0


@pytest.mark.parametrize("headers", [[(b"connection", b"close")], [(b"connection", b"Close")]])
async def test_guard_tells_the_app_of_the_disconnect_after_hypercorn_closes(
        autojump_clock: trio.abc.Clock, headers: list[tuple[bytes, bytes]]) -> None:
    server = FakeServer(headers)
    await _serve_one(server)
    assert server.finished, "the http.disconnect watcher cancelled hypercorn's close"


async def test_guard_holds_the_disconnect_back_for_http_1_0_too(
        autojump_clock: trio.abc.Clock) -> None:
    server = FakeServer([])
    server.scope["http_version"] = "1.0"
    await _serve_one(server)
    assert server.finished


async def test_guard_leaves_a_kept_alive_exchange_alone(autojump_clock: trio.abc.Clock) -> None:
    """Nothing held back: the same cancellation as without the guard (see the module)."""
    server = FakeServer([(b"content-length", b"3")])
    server.body(b"abc", more=False)
    await _serve_one(server)
    assert server.sent[0] == START
    assert not server.finished


async def test_guard_gives_up_draining_after_its_deadline(
        autojump_clock: trio.abc.Clock) -> None:
    server = FakeServer([(b"transfer-encoding", b"chunked")])
    assert await _serve_one(server, seconds=3) == pytest.approx(3)
    assert server.finished  # hypercorn closes the connection: the body is still unfinished


async def test_guard_stops_draining_past_its_byte_budget(
        autojump_clock: trio.abc.Clock) -> None:
    server = FakeServer([(b"transfer-encoding", b"chunked")])
    for _ in range(3):
        server.body(b"x" * 40)
    assert await _serve_one(server, limit=100) == pytest.approx(0)
    assert server.finished


async def test_guard_says_close_for_a_declared_body_over_its_budget(
        autojump_clock: trio.abc.Clock) -> None:
    server = FakeServer([(b"content-length", b"101")])
    assert await _serve_one(server, limit=100) == pytest.approx(0)
    assert server.sent[0]["headers"] == [(b"content-length", b"2"), (b"connection", b"close")]
    assert server.finished


async def test_guard_passes_http2_and_lifespan_through() -> None:
    seen: list[tuple[Receive, Send]] = []

    async def app(scope: Any, receive: Receive, send: Send) -> None:
        seen.append((receive, send))

    server = FakeServer([])
    guarded = guard_early_responses(app, max_drain_bytes=1)
    scopes: list[Any] = [{"type": "http", "http_version": "2", "headers": []},
                         {"type": "lifespan"}]
    for scope in scopes:
        await guarded(scope, server.receive, server.send)
    assert seen == [(server.receive, server.send)] * 2
