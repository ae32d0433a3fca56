"""A host that dies mid-run: another host ends its run within the lease.

Two ``flowsvc serve`` processes, each with its own ``var`` directory and workspace root,
share one PostgreSQL schema and one Redis. A run starts on process A; its model holds the
second turn open (the first wrote a file), so the run is mid-way when A is SIGKILLed (no
shutdown, no flush).
Process B's lease sweep finds the run's expired lease and ends it: a stream read from B
throughout (turn 1's events came from A through Redis) gets ``error`` then ``done``
(``finalStatus`` failed), and the owner's webhook receiver gets
``project.failed`` exactly once. The artifact of the commit A made in turn 1 downloads from
B, which never held A's workspace (the database holds the commit's files).
"""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import httpx
import pytest
import trio

from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema, redis_prefix
from tests.support.fake_openai import FakeOpenAI, Gated, RecordedRequest, Reply, StreamedTurn
from tests.support.projects import host_env, new_project, service_process
from tests.support.server import free_port
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import running_receiver
from tests.support.webhooks import subscribe

LEASE_SECONDS = 2  # short, so the test sees the sweep; B sweeps every third of it
# Wide: a loaded two-core machine; the lease expires 2 s after A's last renewal.
ENDED_WITHIN_SECONDS = 45.0


class DyingHostModel(FakeOpenAI):
    """A model whose caller may be SIGKILLed while it answers: no failure of the model.
    ``holding`` is set once a held (gated) turn was asked for."""

    def __init__(self, script: list[Reply]) -> None:
        super().__init__(script)
        self.holding = trio.Event()

    async def _answer(self, stream: trio.SocketStream, request: RecordedRequest,
                      reply: Reply) -> None:
        if isinstance(reply, Gated):
            self.holding.set()
        await super()._answer(stream, request, reply)

    async def _handle(self, stream: trio.SocketStream) -> None:
        try:
            await super()._handle(stream)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass  # the service was killed while it asked or was answered


PAGE = "<h1>Luigi's</h1>"


def one_write_then_held(held: trio.Event) -> list[Reply]:
    """Turn 1 writes and commits a page; turn 2 waits for ``held``, which is never set."""
    write = StreamedTurn("Writing the home page", [
        ("write_file", json.dumps({"path": "index.html", "content": PAGE})),
        ("git_commit", json.dumps({"message": "Add the home page"}))])
    return [write, Gated(held, StreamedTurn("never sent"))]


@pytest.mark.timeout(240)
async def test_a_run_whose_host_dies_is_ended_by_another_host(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    assert POSTGRES_URL and REDIS_URL, "needs FLOWSVC_TEST_POSTGRES_URL and _REDIS_URL"
    model = DyingHostModel(one_write_then_held(trio.Event()))
    model_url: str = await nursery.start(model.serve)
    prefix = redis_prefix()
    with postgres_schema() as database_url:
        env_a, env_b = (host_env(tmp_path, name, database_url, REDIS_URL, model_url, prefix,
                                   projects={"LEASE_SECONDS": str(LEASE_SECONDS)})
                        for name in ("a", "b"))
        port_a, port_b = free_port(), free_port()
        url_b = f"http://127.0.0.1:{port_b}"
        async with running_receiver() as receiver, \
                service_process(env_a, port_a, tmp_path / "a.log") as process_a, \
                service_process(env_b, port_b, tmp_path / "b.log"), \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_a}", timeout=30) as on_a:
            wallet, _ = await sign_in(on_a)
            registered = await add_token(str(on_a.base_url), "lost", wallet.address.lower())
            assert registered.status_code == 201, registered.text
            await subscribe(on_a, receiver.url(), ["project.failed"])
            slug = (await new_project(on_a, "lost"))["slug"]
            started = await on_a.post(f"/projects/{slug}/start")
            assert started.status_code == 201, started.text
            async with open_sse(url_b, f"/projects/{slug}/stream") as stream:
                assert stream.status == 200
                # Watched from B: turn 1's events, committed and fanned out by A.
                seen = await stream.until("commit", ENDED_WITHIN_SECONDS)
                with trio.fail_after(ENDED_WITHIN_SECONDS):
                    await model.holding.wait()  # A ran turn 1 and asks for turn 2
                process_a.kill()  # SIGKILL: no shutdown, no flush, no more lease renewals
                await process_a.wait()
                events = await stream.until("done", ENDED_WITHIN_SECONDS)
            names = [event.event for event in events]
            assert events[:len(seen)] == seen and names.count("done") == 1, names
            assert names[-2:] == ["error", "done"], names
            assert events[-1].json()["finalStatus"] == "failed", events[-1].data
            assert "stopped" in events[-2].json()["message"], events[-2].data
            [delivered] = await receiver.wait_for(1, ENDED_WITHIN_SECONDS)
            await trio.sleep(3 * LEASE_SECONDS)  # B's later sweeps end nothing again
            assert len(receiver.received) == 1
            envelope = json.loads(delivered.body)
            assert envelope["event"] == "project.failed", envelope
            assert envelope["data"]["slug"] == slug, envelope
            sha = seen[-1].json()["sha"]
            async with httpx.AsyncClient(base_url=url_b, timeout=30) as on_b:
                artifact = await on_b.get(f"/projects/{slug}/artifact", params={"ref": sha})
            assert artifact.status_code == 200, artifact.text
            assert zipfile.ZipFile(io.BytesIO(artifact.content)).read("index.html") \
                == PAGE.encode()
