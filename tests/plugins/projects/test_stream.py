"""The live build stream: replay by Last-Event-ID, the lost-events signal, heartbeats,
restarts, many subscribers and a stalled one (real HTTP and SSE). test_stream_limits has
the stuck readers' cut-offs and the cap per client address."""

from __future__ import annotations

import json
from pathlib import Path

import h11
import trio
from sqlalchemy import func, select

from plugins.projects.tables import stream_events
from runtime.server import Running
from tests.support.fake_openai import FakeOpenAI, Stall, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    crowd_follows_a_run,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.server import client
from tests.support.sse import SseEvent, SseStream, follow, open_sse

CALLS = 600
TOTAL = 2 + 2 * CALLS + 2  # plan, message, calls and results, last message, done


def many_calls_model() -> FakeOpenAI:
    """A model whose first turn makes ``CALLS`` calls, then finishes."""
    calls = [("list_files", "{}")] * CALLS
    return FakeOpenAI([StreamedTurn("Plan:\n1. Look around\n2. Report", calls),
                       StreamedTurn("Done looking.")])


async def read_all(running: Running, path: str, headers: dict[str, str] | None = None
                   ) -> tuple[SseStream, list[SseEvent]]:
    """Open the stream and read up to the first ``done``."""
    async with open_sse(running.base_url, path, headers) as stream:
        return stream, await stream.until("done")


def ids(events: list[SseEvent]) -> list[int]:
    return [int(event.id or 0) for event in events]


async def test_replay_from_any_last_event_id_past_the_ring(
        tmp_path: Path, database_url: str, nursery: trio.Nursery) -> None:
    model = many_calls_model()
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", database_url, backend="openai",
                              model_base_url=base_url, model="fake") as running, \
            token_owner(running, "ring") as http:
        slug = (await new_project(http, "ring"))["slug"]
        path = f"/projects/{slug}/stream"
        async with open_sse(running.base_url, path) as live:
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            everything = await live.until("done", timeout=60)
        assert ids(everything) == list(range(1, TOTAL + 1))
        assert_well_formed(everything)
        first_held = TOTAL - 1000 + 1

        for last_seen in (first_held - 1, 700, TOTAL - 1):
            stream, replay = await read_all(running, path, {"Last-Event-ID": str(last_seen)})
            assert ids(replay) == list(range(last_seen + 1, TOTAL + 1))
            assert replay == everything[last_seen:]
            assert "last-event-id" not in stream.headers
        stream, replay = await read_all(running, f"{path}?lastEventId=1000")
        assert ids(replay) == list(range(1001, TOTAL + 1))
        stream, replay = await read_all(running, f"{path}?lastEventId=5",
                                        {"Last-Event-ID": "1100"})
        assert ids(replay)[0] == 1101

        for lost in ("10", "0", "not-a-number", str(TOTAL + 50)):
            stream, replay = await read_all(running, path, {"Last-Event-ID": lost})
            assert stream.headers["last-event-id"] == str(first_held - 1), lost
            assert ids(replay) == list(range(first_held, TOTAL + 1))
            assert any("events were lost" in comment for comment in stream.comments)

        stored = await running.service.db.read(lambda connection: connection.execute(
            select(func.count()).select_from(stream_events)).scalar_one())
        assert 1000 <= stored < 1100  # the log keeps the ring, trimmed as it grows

        async with open_sse(running.base_url, path, {"Last-Event-ID": str(TOTAL)}) as tail:
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            failed = await tail.until("done")
        assert [event.event for event in failed] == ["error", "done"]
        assert ids(failed) == [TOTAL + 1, TOTAL + 2]
        assert failed[-1].json()["finalStatus"] == "failed"


async def test_a_new_reader_gets_the_latest_run_and_heartbeats(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              heartbeat_seconds="0.2", retry_ms="1500") as running, \
            token_owner(running, "beat") as http:
        slug = (await new_project(http, "beat"))["slug"]
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as idle:
            with trio.fail_after(5):
                while "keepalive" not in idle.comments:
                    await idle._feed()
            assert idle.retry == 1500 and idle.events == []
        first = (await http.post(f"/projects/{slug}/start")).json()["runId"]
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            run_one = await stream.until("done")
        second = (await http.post(f"/projects/{slug}/start")).json()["runId"]
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            run_two = await stream.until("done")
        assert run_one[-1].json()["runId"] == first and run_one[0].id == "1"
        assert run_two[-1].json()["runId"] == second
        assert run_two[0].id == str(len(run_one) + 1) and run_two[0].event == "plan"


async def test_a_restart_loses_no_event(tmp_path: Path, database_url: str,
                                        nursery: trio.Nursery) -> None:
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Wait", [("list_files", "{}")]),
                        Stall(60)])
    base_url = await nursery.start(model.serve)
    settings = {"backend": "openai", "model_base_url": base_url, "model": "fake"}
    async with serve_projects(tmp_path / "var", database_url, **settings) as running, \
            token_owner(running, "restart") as http:
        slug = (await new_project(http, "restart"))["slug"]
        cookie = http.cookies["svc_session"]
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            before = [await stream.next_event() for _ in range(4)]
        assert [event.event for event in before] == ["plan", "message", "tool_call",
                                                     "tool_result"]
    # The service stopped during the run: it was ended as failed on the way out.
    async with serve_projects(tmp_path / "var", database_url, **settings) as running:
        path = f"/projects/{slug}/stream"
        stream, after = await read_all(running, path, {"Last-Event-ID": "2"})
        assert ids(after) == [3, 4, 5, 6]
        assert after[:2] == before[2:]
        assert after[2].event == "error" and after[2].json() == {
            "message": "the service stopped during the run", "recoverable": False}
        assert after[3].json()["finalStatus"] == "failed"
        assert "last-event-id" not in stream.headers
        async with client(running, headers={"Authorization": f"Bearer {cookie}"}) as http:
            view = (await http.get(f"/projects/{slug}")).json()
            assert view["status"] == "failed"
            assert view["lastRun"]["reason"] == "the service stopped during the run"
            assert (await http.post(f"/projects/{slug}/start")).status_code == 201


async def test_five_hundred_subscribers_receive_every_event_in_order(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              streams_per_client="500") as running, \
            token_owner(running, "crowd") as http:
        slug = (await new_project(http, "crowd"))["slug"]
        received = await crowd_follows_a_run(running, http, slug, 500)
        assert len(received) == 500
        reference = received[0]
        assert_well_formed(reference)
        assert reference[-1].event == "done"
        assert all(events == reference for events in received)


def big_reads_model(reads: int) -> FakeOpenAI:
    content = "x" * 40_000
    return FakeOpenAI([
        StreamedTurn("Plan:\n1. Write\n2. Read", [
            ("write_file", json.dumps({"path": "big.txt", "content": content}))]),
        StreamedTurn("", [("read_file", '{"path": "big.txt"}')] * reads),
        StreamedTurn("Read it all."),
    ])


async def test_a_stalled_subscriber_delays_nobody_and_resumes(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model = big_reads_model(reads=120)  # about 5 MB of events
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=base_url, model="fake",
                              subscriber_max_lag="100") as running, \
            token_owner(running, "stall") as http:
        slug = (await new_project(http, "stall"))["slug"]
        path = f"/projects/{slug}/stream"
        # Its socket takes 4 KiB and then nothing: the server's writes to it block once the
        # kernel's buffers (about 3 MB) are full.
        async with open_sse(running.base_url, path, receive_buffer=4096) as stalled:
            readers: list[list[SseEvent]] = []

            async def reader() -> None:
                # Readers in this process may fall behind a run this fast and be cut off
                # too: like EventSource, they come back with Last-Event-ID.
                events, _ = await follow(running.base_url, path)
                readers.append(events)

            async with trio.open_nursery() as others:
                for _ in range(3):
                    others.start_soon(reader)
                await trio.sleep(0.2)
                assert (await http.post(f"/projects/{slug}/start")).status_code == 201
            # Everyone else has the whole run while the stalled reader has read nothing.
            assert len(readers) == 3 and all(r == readers[0] for r in readers)
            complete = readers[0]
            assert_well_formed(complete)
            assert complete[-1].event == "done" and stalled.events == []
            # It is disconnected: with a last comment when its write had gone through, by
            # a reset of the connection when the write was stuck (the kernel's buffers full),
            # or, when the reset races the server's own close, by a close in the middle of a
            # chunk; either way it resumes below.
            try:
                await stalled.until_end(timeout=60)
                assert any("more than 100 events behind" in c for c in stalled.comments)
            except (trio.BrokenResourceError, h11.RemoteProtocolError):
                pass
            assert len(stalled.events) < len(complete)
            assert stalled.events == complete[:len(stalled.events)]
            last_id = stalled.events[-1].id if stalled.events else "0"
        _, rest = await read_all(running, path, {"Last-Event-ID": str(last_id)})
        assert stalled.events + rest == complete
