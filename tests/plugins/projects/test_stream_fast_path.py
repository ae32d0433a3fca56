"""The stream's fast path (``Ring.wake``) over real sockets: the broadcaster writes new events
to its caught-up readers itself; a reader whose socket is full goes back to its own task and
is cut off there, alone; a reader that resumes with Last-Event-ID gets every event once.

What the fast path did is read from ``/metrics``: ``flowsvc_sse_fast_writes_total`` (writes
the broadcaster made) and ``flowsvc_sse_fast_path_left_total`` (readers handed back)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import httpx
import trio

from tests.support.fake_openai import FakeOpenAI, Gated, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    crowd_follows_a_run,
    eventually,
    new_project,
    sample,
    serve_projects,
    token_owner,
)
from tests.support.sse import SseEvent, SseStream, follow, open_sse

READERS = 200
CALLS = 40
ESTABLISHED = 1
READ_TURNS = 200
FAST_WRITES = "flowsvc_sse_fast_writes_total"


def calls(count: int) -> list[tuple[str, str]]:
    return [("list_files", "{}")] * count


async def metric(http: httpx.AsyncClient, name: str) -> float:
    return sample((await http.get("/metrics")).text, name)


def ids(events: list[SseEvent]) -> list[int]:
    return [int(event.id or 0) for event in events]


async def test_many_caught_up_readers_get_every_event_once_in_order_from_the_broadcaster(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Report", calls(CALLS)),
                        StreamedTurn("Done looking.")])
    model_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=model_url, model="fake",
                              streams_per_client=str(READERS)) as running, \
            token_owner(running, "fast") as http:
        slug = (await new_project(http, "fast"))["slug"]
        received = await crowd_follows_a_run(running, http, slug, READERS)
        reference = received[0]
        assert_well_formed(reference)
        assert ids(reference) == list(range(1, 2 + 2 * CALLS + 2 + 1))
        assert len(received) == READERS and all(events == reference for events in received)
        # Every reader was caught up when the run began: at least its first events came
        # from the broadcaster's own writes.
        assert await metric(http, FAST_WRITES) >= READERS


def established(stream: SseStream) -> bool:
    """Whether the connection is still up (from the kernel, without reading the socket)."""
    return stream.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == ESTABLISHED


async def test_a_reader_that_stops_reading_leaves_the_fast_path_and_is_cut_off_alone(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    # About 5 MB of 8 KB events, then small ones: more than a stalled socket's buffers.
    # Three reads a turn, so that a batch of them stays well under WRITE_BYTES: the stalled
    # reader is on the fast path when its socket fills.
    content = "x" * 8_000
    read = ("read_file", '{"path": "big.txt"}')
    model = FakeOpenAI([
        StreamedTurn("Plan:\n1. Write\n2. Read", [
            ("write_file", json.dumps({"path": "big.txt", "content": content}))]),
        *[StreamedTurn("", [read] * 3) for _ in range(READ_TURNS)],
        StreamedTurn("", calls(CALLS)),
        StreamedTurn("Read it all."),
    ])
    model_url = await nursery.start(model.serve)
    write_timeout = 10  # wide: the run ends in about 1 s here, so well within it under load
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=model_url, model="fake",
                              subscriber_max_lag="100000", max_turns=str(READ_TURNS + 10),
                              subscriber_write_timeout_seconds=str(write_timeout)
                              ) as running, token_owner(running, "full") as http:
        slug = (await new_project(http, "full"))["slug"]
        path = f"/projects/{slug}/stream"
        # Its socket takes 4 KiB and then nothing: once the kernel's buffers are full, the
        # broadcaster's write to it cannot go through whole.
        async with open_sse(running.base_url, path, receive_buffer=4096) as stalled:
            readers: list[tuple[list[SseEvent], int]] = []

            async def reader() -> None:
                readers.append(await follow(running.base_url, path, timeout=120))

            async with trio.open_nursery() as others:
                for _ in range(3):
                    others.start_soon(reader)
                await trio.sleep(0.2)
                began = trio.current_time()
                assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            # The others have the whole run, without a reconnect, while the stalled reader
            # is still connected: nobody waited for it to be cut off.
            assert established(stalled)
            assert trio.current_time() - began < write_timeout
            complete, reconnects = readers[0]
            assert_well_formed(complete)
            assert complete[-1].event == "done"
            assert all(events == complete and again == 0 for events, again in readers)
            assert await metric(http, 'flowsvc_sse_fast_path_left_total{reason="would_block"}') \
                >= 1
            assert await metric(http, FAST_WRITES) >= 3

            async def cut_off() -> bool:
                return not established(stalled)

            await eventually(cut_off, timeout=write_timeout + 30)
            assert await metric(
                http, 'flowsvc_sse_readers_cut_total{reason="write_timeout"}') == 1


async def test_a_reader_resuming_with_last_event_id_gets_no_duplicate(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    second_turn = trio.Event()
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Look again", calls(CALLS)),
                        Gated(second_turn, StreamedTurn("", calls(CALLS))),
                        StreamedTurn("Done looking.")])
    model_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=model_url,
                              model="fake") as running, token_owner(running, "resume") as http:
        slug = (await new_project(http, "resume"))["slug"]
        path = f"/projects/{slug}/stream"
        async with open_sse(running.base_url, path) as whole:
            async with open_sse(running.base_url, path) as leaving:
                assert (await http.post(f"/projects/{slug}/start")).status_code == 201
                before = [await leaving.next_event() for _ in range(CALLS)]
            # It left after part of the first turn; the second one is published while it
            # comes back.
            second_turn.set()
            async with open_sse(running.base_url, path,
                                {"Last-Event-ID": str(before[-1].id)}) as back:
                after = await back.until("done")
            reference = await whole.until("done")
        assert_well_formed(reference)
        assert before + after == reference
        assert len(set(ids(before + after))) == len(reference)
        assert await metric(http, FAST_WRITES) >= 2
