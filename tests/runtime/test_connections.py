"""Idle and slow clients, the connection cap, the descriptor limit, and hostile framing.

Every test runs a real service on loopback and speaks to it over raw sockets.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
import pytest
import trio

from runtime.server import Running
from tests.support.raw_http import DEADLINE, RawConnection, connect
from tests.support.server import make_settings, running_server, settings_env

IDLE_CONNECTIONS = 1000
KEEP_ALIVE_SECONDS = 3.0
BODY_SECONDS = 2.0
CAP = 20
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: flowsvc.test\r\n\r\n"


@asynccontextmanager
async def serving(tmp_path: Path, **settings: str) -> AsyncIterator[Running]:
    """A service with the auth plugin and ``FLOWSVC_SERVICE_<KEY>`` settings."""
    extra = {f"FLOWSVC_SERVICE_{key.upper()}": value for key, value in settings.items()}
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'flowsvc.db'}",
                       plugins=["auth"], extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", **extra})
    async with running_server(make_settings(env), env) as running:
        yield running


async def open_after_one_request(running: Running, count: int) -> list[RawConnection]:
    """``count`` connections that each had one request answered and then say nothing."""
    connections: list[RawConnection] = []

    async def one() -> None:
        connection = RawConnection(await connect(running))
        await connection.send(HEALTHZ)
        assert (await connection.answer()).status == 200
        connections.append(connection)

    async with trio.open_nursery() as nursery:
        for _ in range(count):
            nursery.start_soon(one)
    return connections


async def all_closed(connections: list[RawConnection]) -> float:
    """Seconds until the server has closed every one of ``connections`` (fails if one stays
    open past ``DEADLINE``)."""
    began = time.monotonic()
    open_ones: list[RawConnection] = []

    async def watch(connection: RawConnection) -> None:
        if not await connection.closed_by_server():
            open_ones.append(connection)

    async with trio.open_nursery() as nursery:
        for connection in connections:
            nursery.start_soon(watch, connection)
    assert open_ones == [], f"{len(open_ones)} idle connections still open"
    return time.monotonic() - began


async def close_all(connections: list[RawConnection]) -> None:
    for connection in connections:
        await connection.stream.aclose()


async def test_a_thousand_idle_connections_neither_block_a_new_client_nor_stay_open(
        tmp_path: Path) -> None:
    async with serving(tmp_path, keep_alive_timeout_seconds=str(KEEP_ALIVE_SECONDS)) as running:
        idle = await open_after_one_request(running, IDLE_CONNECTIONS)
        try:
            async with httpx.AsyncClient(base_url=running.base_url, timeout=DEADLINE) as http:
                assert (await http.get("/healthz")).status_code == 200
            closed_after = await all_closed(idle)
        finally:
            await close_all(idle)
    print(f"\n{IDLE_CONNECTIONS} idle connections all closed {closed_after:.1f} s after the "
          f"last was answered (keep-alive timeout {KEEP_ALIVE_SECONDS:g} s)")


async def test_a_kept_alive_connection_serves_requests_until_it_is_idle(tmp_path: Path) -> None:
    async with serving(tmp_path, keep_alive_timeout_seconds=str(KEEP_ALIVE_SECONDS)) as running:
        connection = RawConnection(await connect(running))
        for _ in range(3):  # each pause shorter than the timeout: still open
            await connection.send(HEALTHZ)
            assert (await connection.answer()).status == 200
            await trio.sleep(KEEP_ALIVE_SECONDS / 3)
        began = time.monotonic()
        closed = await connection.closed_by_server()
        await connection.stream.aclose()
        assert closed
        assert time.monotonic() - began >= KEEP_ALIVE_SECONDS / 2


async def test_a_shutdown_closes_idle_connections_at_once(tmp_path: Path) -> None:
    async with serving(tmp_path, keep_alive_timeout_seconds="60",
                       shutdown_grace_seconds="30") as running:
        idle = await open_after_one_request(running, 10)
        began = time.monotonic()
    try:
        assert time.monotonic() - began < 10  # neither the idle timeout nor the grace
        assert await all_closed(idle) < 1
    finally:
        await close_all(idle)


async def test_a_trickled_body_is_cut_after_the_body_timeout(tmp_path: Path) -> None:
    body = json.dumps({"address": "0x" + "ab" * 20}).encode()
    async with serving(tmp_path, body_timeout_seconds=str(BODY_SECONDS)) as running:
        connection = RawConnection(await connect(running))
        await connection.send(b"POST /auth/nonce HTTP/1.1\r\nHost: flowsvc.test\r\n"
                              b"Content-Type: application/json\r\n"
                              b"Content-Length: %d\r\n\r\n" % len(body))
        began = time.monotonic()
        answered = trio.Event()

        async def trickle() -> None:  # a byte every half second: 25 s for this body
            for byte in body[:-1]:
                if answered.is_set():
                    return
                try:
                    await connection.send(bytes([byte]))
                except trio.BrokenResourceError:
                    return  # the server closed the connection
                await trio.sleep(0.5)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(trickle)
            answer = await connection.answer()
            answered.set()
        took = time.monotonic() - began
        assert answer.status == 408
        assert answer.error_code() == "request_timeout"
        closed = await connection.closed_by_server()
        await connection.stream.aclose()
        assert answer.headers["connection"] == "close"
        assert closed
    assert BODY_SECONDS <= took < BODY_SECONDS + 10


async def test_connections_past_the_cap_are_refused_with_a_503(tmp_path: Path) -> None:
    async with serving(tmp_path, max_connections=str(CAP)) as running:
        held = await open_after_one_request(running, CAP)
        try:
            refused = RawConnection(await connect(running))
            await refused.send(HEALTHZ)
            answer = await refused.answer()
            assert answer.status == 503
            assert answer.error_code() == "unavailable"
            assert answer.headers["retry-after"].isdigit()
            assert answer.headers["connection"] == "close"
            assert await refused.closed_by_server()
            await refused.stream.aclose()
            await held[0].send(b"GET /metrics HTTP/1.1\r\nHost: flowsvc.test\r\n\r\n")
            metrics = (await held[0].answer()).body.decode()
            assert f"flowsvc_http_connections {CAP}.0" in metrics
            assert "flowsvc_http_connections_refused_total 1.0" in metrics
            await held.pop().stream.aclose()  # a slot frees up: a new client is served
            with trio.fail_after(DEADLINE):
                while True:
                    served = RawConnection(await connect(running))
                    await served.send(HEALTHZ)
                    status = (await served.answer()).status
                    await served.stream.aclose()
                    if status == 200:
                        break
                    await trio.sleep(0.1)
        finally:
            await close_all(held)


@pytest.mark.parametrize("pause", [0.0, 0.2], ids=["together", "smuggled-later"])
async def test_a_request_with_both_framing_headers_is_refused_and_its_connection_closed(
        tmp_path: Path, pause: float) -> None:
    smuggled = b"GET /healthz HTTP/1.1\r\nHost: flowsvc.test\r\n\r\n"
    async with serving(tmp_path) as running:
        connection = RawConnection(await connect(running))
        await connection.send(b"POST /auth/nonce HTTP/1.1\r\nHost: flowsvc.test\r\n"
                              b"Content-Type: application/json\r\nContent-Length: 5\r\n"
                              b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        await trio.sleep(pause)
        try:
            await connection.send(smuggled)
        except trio.BrokenResourceError:
            pass  # closed already: the smuggled request cannot be served either
        answer = await connection.answer()
        assert answer.status == 400
        assert answer.error_code() == "invalid_request"
        closed = await connection.closed_by_server()
        await connection.stream.aclose()
        assert answer.headers["connection"] == "close"
        assert closed
        assert b"HTTP/1.1" not in connection.buffer  # the smuggled request got no answer


async def test_a_double_slash_is_a_404_and_never_a_redirect(tmp_path: Path) -> None:
    async with serving(tmp_path) as running, \
            httpx.AsyncClient(base_url=running.base_url, timeout=DEADLINE) as http:
        for path in ("/marketplace//agents", "//healthz", "/auth//nonce", "/me//"):
            response = await http.get(path, headers={"Host": "attacker.example"})
            assert response.status_code == 404, (path, response.text)
            assert response.json()["error"]["code"] == "not_found"
            assert "location" not in response.headers


def test_the_descriptor_limit_is_raised_to_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(soft, 256)
    script = ("import resource; from runtime.connections import raise_descriptor_limit; "
              "print(raise_descriptor_limit(), resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    lower: Callable[[], None] = lambda: resource.setrlimit(  # noqa: E731
        resource.RLIMIT_NOFILE, (low, hard))
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            check=True, preexec_fn=lower)
    reported, in_force = (int(value) for value in result.stdout.split())
    assert reported == in_force == (hard if hard != resource.RLIM_INFINITY else 1 << 20)
