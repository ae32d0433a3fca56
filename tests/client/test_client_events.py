"""The client's event stream survives a cut connection: it reconnects with ``Last-Event-ID``
and yields every event exactly once, even when the server replays more than it should; and
it says when the service lost events (an id older than its ring, or unknown).

Between the client and a real service sits a small TCP proxy that cuts the first stream
in the middle of an event (after ``CUT_AFTER`` bytes of the answer) and, on the next
connection, notes the ``Last-Event-ID`` the client sent and strips it, so the service
replays the run from its first event and the client must skip what it already yielded.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest
import trio
from flowsvc_client import Client, Event, EventsLost, LostEvents

from tests.support.projects import new_project, serve_projects, token_owner

CUT_AFTER = 1500  # bytes of the first answer: headers and a few events, then the cut


class CuttingProxy:
    """Forwards connections to ``upstream``; cuts the first answer, strips the second
    request's ``Last-Event-ID`` (recorded in ``resumed_from``)."""

    def __init__(self, upstream: int) -> None:
        self.upstream = upstream
        self.connections = 0
        self.resumed_from: list[str] = []

    async def handle(self, client: trio.SocketStream) -> None:
        self.connections += 1
        number = self.connections
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await client.receive_some(65536)
            if not chunk:
                return
            head += chunk
        lines = head.split(b"\r\n")
        kept = [line for line in lines if not line.lower().startswith(b"last-event-id:")]
        self.resumed_from += [line.split(b":", 1)[1].strip().decode()
                              for line in lines if line not in kept]
        async with await trio.open_tcp_stream("127.0.0.1", self.upstream) as server:
            await server.send_all(b"\r\n".join(kept if number == 2 else lines))
            sent = 0
            async with trio.open_nursery() as nursery:
                nursery.start_soon(_pipe, client, server)
                while chunk := await server.receive_some(65536):
                    if number == 1 and sent + len(chunk) >= CUT_AFTER:
                        await client.send_all(chunk[:CUT_AFTER - sent])
                        break
                    await client.send_all(chunk)
                    sent += len(chunk)
                nursery.cancel_scope.cancel()
        await client.aclose()


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    while chunk := await source.receive_some(65536):
        await sink.send_all(chunk)


async def test_a_cut_stream_resumes_and_yields_each_event_once(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              retry_ms="50") as running, \
            token_owner(running, "moon") as owner:
        slug = (await new_project(owner, "moon"))["slug"]
        assert (await owner.post(f"/projects/{slug}/start")).status_code == 201
        with Client(running.base_url) as direct:
            whole = await trio.to_thread.run_sync(lambda: list(direct.project_events(slug)))
        assert whole[-1].event == "done" and len(whole) > 10

        proxy = CuttingProxy(int(running.base_url.rsplit(":", 1)[1]))
        async with trio.open_nursery() as nursery:
            [listener] = await nursery.start(
                partial(trio.serve_tcp, proxy.handle, 0, host="127.0.0.1"))
            port = listener.socket.getsockname()[1]
            with Client(f"http://127.0.0.1:{port}") as flow:
                through: list[Event] = await trio.to_thread.run_sync(
                    lambda: list(flow.project_events(slug)))
            nursery.cancel_scope.cancel()
    assert through == whole
    assert proxy.connections == 2
    # It resumed after the last complete event before the cut (a partial one is dropped).
    [resumed] = proxy.resumed_from
    assert 1 <= int(resumed) < len(whole) - 1


async def test_events_the_service_lost_are_reported(tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              replay_events="10") as running, \
            token_owner(running, "moon") as owner:
        slug = (await new_project(owner, "moon"))["slug"]
        assert (await owner.post(f"/projects/{slug}/start")).status_code == 201

        def read(last_event_id: str | None = None) -> tuple[list[Event], list[LostEvents]]:
            with Client(running.base_url) as flow:
                stream = flow.project_events(slug, last_event_id=last_event_id)
                return list(stream), stream.lost

        whole, lost = await trio.to_thread.run_sync(read)
        assert whole[-1].event == "done" and lost == []
        last = int(whole[-1].id or 0)
        assert last > 12
        held = [event for event in whole if int(event.id or 0) > last - 10]
        # Resuming from an id the ring no longer holds: the rest of the ring, and the loss.
        events, lost = await trio.to_thread.run_sync(read, "2")
        assert events == held and lost == [LostEvents("2", str(last - 10))]
        # An id it never gave: the whole ring, none of it skipped as already seen.
        events, lost = await trio.to_thread.run_sync(read, "9999")
        assert events == held and lost == [LostEvents("9999", str(last - 10))]
        # A resume it can serve loses nothing.
        events, lost = await trio.to_thread.run_sync(read, str(last - 5))
        assert events == held[-5:] and lost == []

        def raising() -> tuple[EventsLost, list[Event]]:
            with Client(running.base_url) as flow:
                stream = flow.project_events(slug, last_event_id="2", raise_on_lost=True)
                with pytest.raises(EventsLost) as raised:
                    next(stream)
                return raised.value, list(stream)  # it carries on with the replay

        error, rest = await trio.to_thread.run_sync(raising)
        assert error.lost == LostEvents("2", str(last - 10)) and rest == held
