"""A process asked to stop drains: it leaves the balancer, hands its readers over, finishes its
run and exits 0.

Two ``flowsvc serve`` processes, A and B, share one PostgreSQL schema and one Redis, each
with its own ``var`` directory and workspace root. A run on A is mid-way (its model holds
the second turn) and a reader follows its stream on A when A gets SIGTERM. A's ``/readyz``
then answers 503 ``draining``, a new run is refused there, and the reader's stream ends with
a comment saying so; it reconnects to B with ``Last-Event-ID``. The model then
answers: the run finishes on A during the drain, B's reader gets the rest of the events
(every event exactly once across both streams), the owner's ``project.completed`` webhook
fires once, and A exits 0 without waiting for its drain deadline.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema, redis_prefix
from tests.support.fake_openai import FakeOpenAI, Gated, StreamedTurn
from tests.support.projects import (
    assert_well_formed,
    eventually,
    host_env,
    new_project,
    service_process,
)
from tests.support.server import free_port
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import running_receiver
from tests.support.webhooks import subscribe

DRAIN_SECONDS = 60  # far above what the run needs: A must exit once the run ends, not then
WITHIN_SECONDS = 45.0  # wide: a loaded two-core machine


@pytest.mark.timeout(240)
async def test_a_draining_process_hands_its_readers_over_and_finishes_its_run(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    assert POSTGRES_URL and REDIS_URL, "needs FLOWSVC_TEST_POSTGRES_URL and _REDIS_URL"
    answer = trio.Event()
    write = StreamedTurn("Writing the home page", [("write_file", json.dumps(
        {"path": "index.html", "content": "<h1>Luigi's</h1>"}))])
    model = FakeOpenAI([write, Gated(answer, StreamedTurn("The site is ready."))])
    model_url: str = await nursery.start(model.serve)
    prefix = redis_prefix()
    with postgres_schema() as database_url:
        env_a, env_b = (host_env(tmp_path, name, database_url, REDIS_URL, model_url, prefix,
                                   extra={"FLOWSVC_SERVICE_LOG_LEVEL": "info",
                                    "FLOWSVC_SERVICE_DRAIN_SECONDS": str(DRAIN_SECONDS)})
                        for name in ("a", "b"))
        port_a, port_b = free_port(), free_port()
        url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        async with running_receiver() as receiver, \
                service_process(env_a, port_a, tmp_path / "a.log") as process_a, \
                service_process(env_b, port_b, tmp_path / "b.log"), \
                httpx.AsyncClient(base_url=url_a, timeout=30) as on_a:
            wallet, _ = await sign_in(on_a)
            for token in ("drained", "later"):
                registered = await add_token(url_a, token, wallet.address.lower())
                assert registered.status_code == 201, registered.text
            await subscribe(on_a, receiver.url(), ["project.completed", "project.failed"])
            slug = (await new_project(on_a, "drained"))["slug"]
            later = (await new_project(on_a, "later"))["slug"]
            started = await on_a.post(f"/projects/{slug}/start")
            assert started.status_code == 201, started.text
            path = f"/projects/{slug}/stream"
            async with open_sse(url_a, path) as on_a_stream:
                assert on_a_stream.status == 200
                await on_a_stream.until("tool_result", WITHIN_SECONDS)
                await eventually(lambda: _asked_twice(model), WITHIN_SECONDS)
                process_a.send_signal(signal.SIGTERM)
                await on_a_stream.until_end(WITHIN_SECONDS)
            # The stream ended with the drain's hint, after its head's retry: (3 s).
            assert on_a_stream.retry == 3000
            assert on_a_stream.comments[-1] == \
                "disconnected, this process is shutting down; reconnect with Last-Event-ID"
            from_a = on_a_stream.events
            # New connections are still served while the balancer notices, each closed
            # after its request. (``on_a``'s kept-alive connection is closed by the drain,
            # maybe while a request is on its way: a client retries on a new connection.)
            async with httpx.AsyncClient(base_url=url_a, timeout=30,
                                         cookies=on_a.cookies) as new_on_a:
                ready = await new_on_a.get("/readyz")
                assert ready.status_code == 503, ready.text
                assert ready.json()["error"]["code"] == "draining", ready.text
                assert ready.json()["status"] == "draining" and ready.headers["Retry-After"]
                assert ready.headers["Connection"] == "close"
                refused = await new_on_a.post(f"/projects/{later}/start")
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "draining", refused.text
            assert process_a.returncode is None  # its run holds the drain
            async with open_sse(url_b, path, {"Last-Event-ID": str(from_a[-1].id)}) as on_b:
                assert on_b.status == 200 and "last-event-id" not in on_b.headers
                answer.set()  # the run goes on, on A, during its drain
                from_b = await on_b.until("done", WITHIN_SECONDS)
            events = from_a + from_b
            assert_well_formed(events)  # ids 1, 2, 3...: every event once, in order
            names = [event.event for event in events]
            assert names.count("done") == 1 and "error" not in names, names
            assert events[-1].json()["finalStatus"] == "completed", events[-1].data
            with trio.fail_after(WITHIN_SECONDS):  # well before DRAIN_SECONDS
                code = await process_a.wait()
            output = (tmp_path / "a.log").read_text()
            assert code == 0, output[-3000:]
            assert "drain: no work in progress; stopping" in output, output[-3000:]
            [delivered] = await receiver.wait_for(1, WITHIN_SECONDS)
            envelope = json.loads(delivered.body)
            assert envelope["event"] == "project.completed", envelope
            assert envelope["data"]["slug"] == slug, envelope
            await trio.sleep(1)  # nothing else arrives
            assert len(receiver.received) == 1


async def _asked_twice(model: FakeOpenAI) -> bool:
    """The run is mid-way: turn 1 is done and it waits for turn 2."""
    return len(model.requests) >= 2
