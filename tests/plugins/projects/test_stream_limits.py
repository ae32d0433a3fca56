"""The stream's limits over real sockets: readers stuck in a write are cut off (past the lag,
or after the write timeout), and each client address holds a bounded number of streams."""

from __future__ import annotations

import json
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import trio

from runtime.server import Running
from tests.support.fake_openai import FakeOpenAI, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    eventually,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.sse import SseEvent, follow, open_sse

STALLED = 40
BIG_READS = 100  # about 4 MB of events: more than the kernel buffers of a stalled reader
ESTABLISHED = 1


def stalling_run(small_calls: int) -> FakeOpenAI:
    """A run that first sends about 4 MB of events, then ``2 * small_calls`` small ones."""
    content = "x" * 40_000
    return FakeOpenAI([
        StreamedTurn("Plan:\n1. Write\n2. Read", [
            ("write_file", json.dumps({"path": "big.txt", "content": content}))]),
        StreamedTurn("", [("read_file", '{"path": "big.txt"}')] * BIG_READS),
        StreamedTurn("", [("list_files", "{}")] * small_calls),
        StreamedTurn("Read it all."),
    ])


@asynccontextmanager
async def stalled_readers(running: Running, path: str, count: int
                          ) -> AsyncIterator[list[trio.socket.SocketType]]:
    """``count`` connections that ask for the stream with a 4 KiB receive buffer and then
    never read a byte."""
    host, port = running.base_url.removeprefix("http://").split(":")
    sockets = []
    try:
        for _ in range(count):
            sock = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            await sock.connect((host, int(port)))
            await sock.send(f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
                            "Accept: text/event-stream\r\n\r\n".encode())
        yield sockets
    finally:
        for sock in sockets:
            sock.close()


def still_connected(sockets: list[trio.socket.SocketType]) -> int:
    """How many are still established (read from the kernel, without reading the socket)."""
    return sum(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == ESTABLISHED
               for sock in sockets)


async def until_disconnected(sockets: list[trio.socket.SocketType], timeout: float) -> None:
    async def all_cut_off() -> bool:
        return still_connected(sockets) == 0

    with trio.move_on_after(timeout):
        await eventually(all_cut_off, timeout=timeout + 1)
    assert still_connected(sockets) == 0, f"{still_connected(sockets)} still connected"


@asynccontextmanager
async def run_with_stalled_readers(tmp_path: Path, nursery: trio.Nursery, *, small_calls: int,
                                   stalled: int, **settings: str
                                   ) -> AsyncIterator[tuple[Running, str, list[SseEvent],
                                                            list[trio.socket.SocketType]]]:
    """A service with ``settings``, ``stalled`` readers that never read, and a whole
    ``stalling_run`` that a reader who reads followed: the service, the stream's path, the
    run's events and the stalled readers' sockets."""
    model = stalling_run(small_calls)
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}", "", None,
                              backend="openai", model_base_url=base_url, model="fake",
                              **settings) as running, token_owner(running, "stuck") as http:
        slug = (await new_project(http, "stuck"))["slug"]
        path = f"/projects/{slug}/stream"
        async with stalled_readers(running, path, stalled) as sockets:
            await trio.sleep(0.5)
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            events, _ = await follow(running.base_url, path, timeout=120)
            assert_well_formed(events)
            assert events[-1].event == "done"
            yield running, path, events, sockets


async def test_readers_stuck_past_the_lag_are_cut_off_and_others_get_everything(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    # 600 small events after the stall: past the lag of 500.
    async with run_with_stalled_readers(tmp_path, nursery, small_calls=300, stalled=STALLED,
                                        subscriber_write_timeout_seconds="3600",
                                        streams_per_client="100") as (_, _, events, stalled):
        assert len(events) > 2 * 300 + 2 * BIG_READS
        # The run is over: whoever is past the lag now was stuck in a write during it.
        await until_disconnected(stalled, timeout=30)


async def test_a_write_that_never_finishes_is_cut_off_after_the_timeout(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    async with run_with_stalled_readers(tmp_path, nursery, small_calls=0, stalled=2,
                                        subscriber_write_timeout_seconds="1",
                                        subscriber_max_lag="100000"
                                        ) as (running, path, events, stalled):
        await until_disconnected(stalled, timeout=30)
        # A reader who reads is never cut off, however long the stream stays open.
        async with open_sse(running.base_url, path, {"Last-Event-ID": "0"}) as reader:
            replay = await reader.until("done")
            with trio.move_on_after(2.5):
                await reader.until_end()
            assert not reader.ended and replay == events[len(events) - len(replay):]


async def test_each_client_address_holds_a_bounded_number_of_streams(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              streams_per_client="3",
                              extra_env={"FLOWSVC_SERVICE_TRUSTED_PROXIES": '["127.0.0.1"]'}
                              ) as running, token_owner(running, "cap") as http:
        slug = (await new_project(http, "cap"))["slug"]
        path = f"/projects/{slug}/stream"
        behind = {"X-Forwarded-For": "203.0.113.7"}
        async with open_sse(running.base_url, path) as first, \
                open_sse(running.base_url, path) as second, \
                open_sse(running.base_url, path, behind) as proxied:
            assert (first.status, second.status, proxied.status) == (200, 200, 200)
            async with open_sse(running.base_url, path) as third:
                assert third.status == 200
                async with open_sse(running.base_url, path) as refused:
                    assert refused.status == 429
                    assert int(refused.headers["retry-after"]) > 0
                    assert json.loads(await refused.body())["error"]["code"] == \
                        "too_many_streams"
            # Another address behind the trusted proxy has slots of its own.
            async with open_sse(running.base_url, path, behind) as second_behind:
                assert second_behind.status == 200
        # Closed streams give their slots back (once the server has seen them close).
        async def three_open() -> bool:
            async with open_sse(running.base_url, path) as one, \
                    open_sse(running.base_url, path) as two, \
                    open_sse(running.base_url, path) as three:
                return (one.status, two.status, three.status) == (200, 200, 200)

        await eventually(three_open, timeout=10)
