"""Runs: the model backend against a fake server, failures, cancellation, the queue's
priorities and the reusable start-a-run API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from plugins.projects.engine.ending import PROJECT_FAILED
from plugins.projects.engine.execute import offered_tools
from plugins.projects.engine.run_rows import RunRecord, get_run
from plugins.projects.engine.submit import RunRequest, start_run
from plugins.projects.engine.templates import builtin_templates
from plugins.projects.live.hub import subscribe
from plugins.projects.state import PROJECTS_STATE
from runtime.sandbox.jail import cgroups_state
from runtime.server import Running
from tests.support.fake_openai import FakeOpenAI, HttpFailure, Stall, StreamedTurn
from tests.support.projects import (
    EventRecorder,
    GrantedFeatures,
    assert_well_formed,
    eventually,
    new_project,
    serve_projects,
    token_owner,
)
from tests.support.server import client
from tests.support.sse import SseEvent, open_sse


def turn(text: str, *calls: tuple[str, Any]) -> StreamedTurn:
    return StreamedTurn(text, [(name, json.dumps(args)) for name, args in calls])


def names(events: list[SseEvent]) -> list[str]:
    return [event.event for event in events]


async def run_to_done(running: Running, http: Any, slug: str) -> list[SseEvent]:
    """Start a run and read its events: a reader without Last-Event-ID gets the latest run
    from its first event, whenever it connects."""
    started = await http.post(f"/projects/{slug}/start")
    assert started.status_code == 201, started.text
    async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
        events = await stream.until("done", timeout=30)
    assert events[-1].json()["runId"] == started.json()["runId"]
    return events


async def test_a_model_run_with_an_unknown_tool_then_one_that_errors(
        tmp_path: Path, database_url: str, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([
        turn("Plan:\n1. Write the page\n2. Commit it",
             ("write_file", {"path": "index.html", "content": "<h1>Luigi</h1>"}),
             ("launch_rocket", {"to": "mars"})),
        turn("", ("git_commit", {"message": "Add the page"})),
        turn("The page is committed."),
        HttpFailure(500, "upstream exploded"),
    ])
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", database_url, backend="openai",
                              model_base_url=base_url, model="fake-model",
                              model_api_key="sk-test") as running, \
            token_owner(running, "model") as http:
        recorder = EventRecorder()
        running.service.pm.register(recorder, name="recorder")
        slug = (await new_project(http, "model"))["slug"]

        events = await run_to_done(running, http, slug)
        assert_well_formed(events)
        assert names(events) == ["plan", "message", "tool_call", "tool_result", "tool_call",
                                 "tool_result", "tool_call", "tool_result", "commit",
                                 "message", "done"]
        assert events[0].json() == {"steps": ["Write the page", "Commit it"], "revision": 1}
        unknown = events[5].json()
        assert unknown["error"].startswith("unknown tool 'launch_rocket'; available tools:")
        assert "run_command" in unknown["error"]  # on by default where the sandbox works
        assert events[-1].json()["finalStatus"] == "completed"
        request = model.requests[0]
        assert request.headers["authorization"] == "Bearer sk-test"
        assert request.body["model"] == "fake-model" and request.body["stream"] is True
        offered = {tool["function"]["name"] for tool in request.body["tools"]}
        assert offered == {"write_file", "read_file", "list_files", "git_commit",
                           "take_screenshot", "run_command", "fetch_url"}

        failed = await run_to_done(running, http, slug)
        assert names(failed) == ["error", "done"]
        assert failed[0].json() == {"message": "model endpoint answered HTTP 500: upstream "
                                               "exploded", "recoverable": False}
        assert failed[-1].json()["finalStatus"] == "failed"
        view = (await http.get(f"/projects/{slug}")).json()
        assert view["status"] == "failed" and view["artifactUrl"] is None
        [event] = [e for e in recorder.events if e.name == PROJECT_FAILED]
        assert event.data == {"slug": slug, "reason": failed[0].json()["message"],
                              "run_id": failed[-1].json()["runId"]}


async def test_timeouts_crashes_and_cancellation_end_runs(
        tmp_path: Path, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([Stall(30), Stall(30)])
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=base_url, model="m",
                              run_timeout_seconds="0.5") as running, \
            token_owner(running, "fragile") as http:
        project = await new_project(http, "fragile")
        slug = project["slug"]
        timed_out = await run_to_done(running, http, slug)
        assert names(timed_out) == ["error", "done"]
        assert timed_out[0].json()["message"] == "the run timed out after 0.5 seconds"
        assert timed_out[1].json()["finalStatus"] == "failed"

        workspace = running.service.settings.service.var_dir / "workspaces" / project["id"]
        workspace.rename(workspace.with_name("moved"))
        workspace.write_text("a file where the workspace should be")
        crashed = await run_to_done(running, http, slug)
        assert names(crashed) == ["error", "done"]
        assert crashed[0].json()["message"] == "the run crashed: FileExistsError"
        assert (await http.get(f"/projects/{slug}")).json()["status"] == "failed"
        workspace.unlink()

    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=base_url,
                              model="m") as running:
        async with token_owner(running, "patient") as http:
            slug = (await new_project(http, "patient"))["slug"]
            async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
                assert (await http.post(f"/projects/{slug}/start")).status_code == 201

                async def model_asked() -> bool:
                    return len(model.requests) == 2

                await eventually(model_asked)
                cancelled = await http.post(f"/projects/{slug}/cancel")
                assert cancelled.status_code == 200
                assert cancelled.json()["status"] == "cancelled"
                assert cancelled.json()["lastRun"]["reason"] == "cancelled by the owner"
                events = await stream.until("done")
            assert names(events) == ["done"]
            assert events[0].json()["finalStatus"] == "cancelled"
            again = await http.post(f"/projects/{slug}/start")
            assert again.status_code == 201


async def test_the_queue_orders_runs_by_priority(tmp_path: Path, nursery: trio.Nursery
                                                 ) -> None:
    model = FakeOpenAI([Stall(2), *[turn("Done.")] * 4])
    base_url = await nursery.start(model.serve)
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                              backend="openai", model_base_url=base_url, model="m",
                              run_slots="1", dedicated_slots="1",
                              model_timeout_seconds="1") as running:
        granted = GrantedFeatures({})
        running.service.pm.register(granted, name="features")
        owners = {}
        for name in ("blocker", "plain", "priority", "dedicated"):
            owners[name] = token_owner(running, name)
        clients = {name: await context.__aenter__() for name, context in owners.items()}
        try:
            users = {name: int((await http.get("/me")).json()["user"]["id"])
                     for name, http in clients.items()}
            granted.flags[users["priority"]] = {"priorityQueue": True}
            granted.flags[users["dedicated"]] = {"dedicatedRuntime": True}
            slugs = {name: (await new_project(http, name))["slug"]
                     for name, http in clients.items()}
            run_ids = {}
            for name in ("blocker", "plain", "priority", "dedicated"):
                answer = await clients[name].post(f"/projects/{slugs[name]}/start")
                run_ids[name] = answer.json()["runId"]
                await trio.sleep(0.05)
            async def all_ended() -> bool:
                runs.update({name: await running.service.db.read(get_run, run_id)
                             for name, run_id in run_ids.items()})
                return all(run is not None and run.ended_at for run in runs.values())

            runs: dict[str, RunRecord | None] = {}
            await eventually(all_ended, timeout=20)
            started = {name: run.started_at for name, run in runs.items()
                       if run is not None and run.started_at is not None}
            blocker = runs["blocker"]
            assert blocker is not None and blocker.ended_at is not None
            # The dedicated run took its own slot while the blocker held the shared one;
            # the others waited for the shared slot, the priority user first.
            assert started["dedicated"] < blocker.ended_at
            assert started["priority"] < started["plain"]
            assert started["blocker"] < started["priority"]
        finally:
            for context in owners.values():
                await context.__aexit__(None, None, None)


async def test_a_run_started_through_the_api_as_the_marketplace_would(
        tmp_path: Path) -> None:
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") \
            as running, token_owner(running, "market") as http:
        service = running.service
        user_id = int((await http.get("/me")).json()["user"]["id"])
        template = {t.name: t for t in builtin_templates()}["research-agent"]
        charged: list[str] = []

        async def charge(tool: str, call_id: str) -> None:
            if len(charged) == 2:
                raise RuntimeError("insufficient FLOW balance")
            charged.append(tool)

        request = RunRequest(owner_id=user_id, template=template, brief="Study tides.",
                             workspace=tmp_path / "agent-run", stream="agent-run-7",
                             before_tool_call=charge, key_id=None)
        run_id = await start_run(service, request)

        async def ended() -> bool:
            run = await service.db.read(get_run, run_id)
            return run is not None and run.ended_at is not None

        await eventually(ended)
        run = await service.db.read(get_run, run_id)
        assert run is not None and run.status == "failed" and run.project_id is None
        assert run.reason == "tool call 'write_file' was refused: insufficient FLOW balance"
        assert charged == ["write_file", "git_commit"]
        assert (tmp_path / "agent-run" / "report.md").is_file()
        subscription, lost = await subscribe(service, "agent-run-7", "0", None, 15.0)
        frames = b"".join(subscription.take()).decode()
        assert lost is None
        assert frames.count("event: tool_call") == 2
        assert f'"runId":"{run_id}","finalStatus":"failed"' in frames


async def test_without_a_sandbox_no_tool_that_needs_it_is_offered(tmp_path: Path,
                                                                  database_url: str) -> None:
    async with serve_projects(tmp_path / "var", database_url,
                              extra_env={"FLOWSVC_SANDBOX_ACTIVE": "false"}) as running:
        settings = running.service.state(PROJECTS_STATE).settings
        assert set(offered_tools(running.service, settings)) == {
            "write_file", "read_file", "list_files", "git_commit", "fetch_url"}
        async with client(running) as http:
            ready = await http.get("/readyz")
    assert ready.status_code == 200  # the service serves; it offers fewer tools
    reason = "turned off by [sandbox] active = false"
    assert ready.json()["checks"]["sandbox"] == {"ok": True, "commands": reason,
                                                 "browser": reason, "cgroups": cgroups_state()}
