"""Early answers (401, 405, 413) before the request body has arrived, over a real server.

Each test speaks raw HTTP/1.1 on one kept-alive connection: the request head and part of its
body, the early answer, then the rest of the body and a second request. Without
``runtime.early_response`` the second request is never answered and the connection never
closed (docs/hypercorn-early-response.md); the tests fail on a deadline instead of hanging.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from runtime.early_response import guard_early_responses
from runtime.server import Running
from tests.support.raw_http import RawConnection, connect
from tests.support.server import make_settings, running_server, settings_env

MAX_BODY = 4096
ADDRESS = "0x" + "ab" * 20


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=["auth"],
                       extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                              "FLOWSVC_SERVICE_MAX_BODY_BYTES": str(MAX_BODY)})
    async with running_server(make_settings(env), env) as served:
        yield served


def _head(method: str, path: str, *, length: int | None = None) -> bytes:
    """A request head with a body of ``length`` bytes, or a chunked one."""
    lines = [f"{method} {path} HTTP/1.1", "Host: flowsvc.test",
             "Content-Type: application/json"]
    lines.append(f"Content-Length: {length}" if length is not None
                 else "Transfer-Encoding: chunked")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _let_the_server_finish() -> None:
    """Let the server finish the early exchange before the rest of the body leaves.

    The server runs in this test's Trio run: once every task is blocked, it has either closed
    the exchange (the bug) or is waiting for the rest of the body (the fix). Sending the rest
    at once would often arrive in time to hide the bug, as a quick client does.
    """
    with trio.move_on_after(2):  # in case some task never rests for the whole cushion
        await trio.testing.wait_all_tasks_blocked(cushion=0.05)


NONCE = json.dumps({"address": ADDRESS}).encode()
SECOND = _head("POST", "/auth/nonce", length=len(NONCE)) + NONCE


async def _second_request_is_answered(connection: RawConnection) -> None:
    answer = await connection.answer()
    assert answer.status == 200, answer
    assert json.loads(answer.body)["nonce"]


async def test_a_401_before_the_body_keeps_the_connection_usable(running: Running) -> None:
    body = json.dumps({"reason": "x" * 1000}).encode()
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(_head("POST", "/auth/logout", length=len(body)) + body[:300])
        early = await connection.answer()
        assert (early.status, early.error_code()) == (401, "unauthenticated")
        assert "close" not in early.headers.get("connection", "")
        await _let_the_server_finish()
        await connection.send(body[300:] + SECOND)
        await _second_request_is_answered(connection)


@pytest.mark.parametrize("framing", ["content-length", "chunked"])
async def test_a_405_before_the_body_keeps_the_connection_usable(running: Running,
                                                                 framing: str) -> None:
    body = b'{"anything": "' + b"y" * 1500 + b'"}'
    if framing == "chunked":
        head, first = _head("POST", "/me"), _chunk(body[:500])
        rest = _chunk(body[500:]) + b"0\r\n\r\n"
    else:
        head, first, rest = _head("POST", "/me", length=len(body)), body[:500], body[500:]
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(head + first)
        early = await connection.answer()
        assert (early.status, early.error_code()) == (405, "method_not_allowed")
        await _let_the_server_finish()
        await connection.send(rest + SECOND)
        await _second_request_is_answered(connection)


async def test_the_whole_body_after_the_answer_keeps_the_connection_usable(
        running: Running) -> None:
    body = b'{"a": 1}'
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(_head("POST", "/auth/logout", length=len(body)))
        assert (await connection.answer()).status == 401
        await _let_the_server_finish()
        await connection.send(body + SECOND)
        await _second_request_is_answered(connection)


async def test_a_413_closes_the_connection_instead_of_hanging(running: Running) -> None:
    body = b"z" * (2 * MAX_BODY)
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(_head("POST", "/auth/nonce", length=len(body)) + body[:1000])
        early = await connection.answer()
        assert (early.status, early.error_code()) == (413, "payload_too_large")
        assert early.headers["connection"] == "close"
        await _let_the_server_finish()
        try:
            await connection.send(body[1000:] + SECOND)
        except trio.BrokenResourceError:
            pass  # already closed, as it should be
        assert await connection.closed_by_server(), "the connection hangs, neither used nor closed"
        assert b"HTTP/1.1" not in connection.buffer  # the second request was not served


async def test_an_early_answer_to_a_body_over_the_limit_says_close_and_closes(
        running: Running) -> None:
    """Too big to drain: the 401 says ``Connection: close`` and the server closes."""
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(_head("POST", "/auth/logout", length=10 * MAX_BODY) + b"{")
        early = await connection.answer()
        assert (early.status, early.headers["connection"]) == (401, "close")
        assert await connection.closed_by_server(), "the connection hangs, neither used nor closed"


@pytest.mark.parametrize("request_line", [
    b"GET /healthz HTTP/1.1\r\nHost: flowsvc.test\r\nConnection: close\r\n\r\n",
    b"GET /healthz HTTP/1.0\r\n\r\n",  # h11 keeps no HTTP/1.0 connection alive
], ids=["connection-close", "http-1.0"])
async def test_a_request_saying_close_is_answered_and_closed(running: Running,
                                                             request_line: bytes) -> None:
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        await connection.send(request_line)
        assert (await connection.answer()).status == 200
        assert await connection.closed_by_server(), "the connection hangs, neither used nor closed"


async def test_read_bodies_keep_the_connection_alive(running: Running) -> None:
    async with await connect(running) as stream:
        connection = RawConnection(stream)
        for _ in range(3):
            await connection.send(SECOND)
            await _second_request_is_answered(connection)


# The guard alone, around an app that behaves like quart-trio, with a fake hypercorn.

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
