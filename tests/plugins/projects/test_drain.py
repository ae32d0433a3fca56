"""The drain's deadline: a run that does not finish within ``service.drain_seconds`` is ended
``failed`` by its own process, a queued run is ended at once, and the service stops.

In-process (the drain begun as a signal would begin it; tests/system/test_drain.py sends the
signal): one run slot, a run whose model never answers, another run queued behind it. The
service restarted on the same database then replays each stream: an ``error`` and one
``done`` each, nothing left ``running``.
"""

from __future__ import annotations

from pathlib import Path

import trio

from runtime.server import Running, run_server
from tests.support.fake_openai import FakeOpenAI, Stall
from tests.support.projects import (
    eventually,
    new_project,
    projects_env,
    serve_projects,
    token_owner,
)
from tests.support.server import make_settings
from tests.support.sse import open_sse

DRAIN_SECONDS = 1.0
STOPPED_WITHIN_SECONDS = 30.0  # wide: a loaded two-core machine


async def test_the_drain_ends_what_it_cannot_wait_for_and_the_service_stops(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([Stall(120)])
    model_url = await nursery.start(model.serve)
    database_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    settings = {"backend": "openai", "model_base_url": model_url, "model": "m",
                "run_slots": "1"}
    env = projects_env(tmp_path / "var", database_url=database_url,
                       extra_env={"FLOWSVC_SERVICE_DRAIN_SECONDS": str(DRAIN_SECONDS)},
                       **settings)
    stopped = trio.Event()
    codes: list[int] = []

    async def serve(*, task_status: trio.TaskStatus[Running]) -> None:
        codes.append(await run_server(make_settings(env), bind="127.0.0.1:0",
                                      handle_signals=False, environ=env,
                                      task_status=task_status))
        stopped.set()

    running: Running = await nursery.start(serve)
    slugs = {}
    for name in ("held", "queued"):
        async with token_owner(running, name) as http:
            slugs[name] = (await new_project(http, name))["slug"]
            started = await http.post(f"/projects/{slugs[name]}/start")
            assert started.status_code == 201, started.text
    await eventually(lambda: _asked(model))  # the held run runs, the other one waits
    began = trio.current_time()
    running.service.drain.begin()
    with trio.fail_after(STOPPED_WITHIN_SECONDS):
        await stopped.wait()
    assert codes == [0]
    assert trio.current_time() - began >= DRAIN_SECONDS  # it waited for the held run

    async with serve_projects(tmp_path / "var", database_url, **settings) as again:
        endings = {}
        for name, slug in slugs.items():
            async with open_sse(again.base_url, f"/projects/{slug}/stream",
                                {"Last-Event-ID": "0"}) as stream:
                events = await stream.until("done")
            assert [event.event for event in events][-2:] == ["error", "done"], events
            assert [event.event for event in events].count("done") == 1, events
            assert events[-1].json()["finalStatus"] == "failed"
            endings[name] = events[-2].json()["message"]
    assert endings == {"held": "the service stopped during the run",
                       "queued": "the service stopped before the run started"}


async def _asked(model: FakeOpenAI) -> bool:
    return len(model.requests) == 1
