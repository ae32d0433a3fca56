"""The agent loop: offline template runs, a model-driven run, and how runs stop."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from plugins.projects.engine.agent_loop import RunOutcome, run_agent
from plugins.projects.engine.model_backends import OfflineBackend, OpenAIChatBackend
from plugins.projects.engine.sandboxed_tools import sandboxed_tools
from plugins.projects.engine.templates import builtin_templates
from plugins.projects.engine.tools import builtin_tools
from runtime.agents import (
    AgentTemplate,
    JsonObject,
    PlannedCall,
    PlannedStep,
    Tool,
    ToolContext,
    ToolResult,
)
from tests.support.fake_openai import FakeOpenAI, HttpFailure, StreamedTurn
from tests.support.sandbox import git as git_output
from tests.support.sandbox import probed_sandbox

BRIEF = ("Build a pizza ordering site for Luigi's. Customers pick toppings and pay online. "
         "Orders show up on a kitchen screen.")
TEMPLATES = {template.name: template for template in builtin_templates()}
TOOLS = {tool.name: tool for tool in [*builtin_tools(), *sandboxed_tools()]}


class Recorder:
    """Collects emitted events in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, JsonObject]] = []

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        self.events.append((name, data))

    def of(self, name: str) -> list[JsonObject]:
        return [data for event, data in self.events if event == name]


async def git(workspace: Path, *arguments: str) -> list[str]:
    return (await git_output(workspace, *arguments)).splitlines()


async def context_for(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path / "ws", public_base_url="https://flow.example",
                       project_slug="pizza", sandbox=await probed_sandbox())


def assert_calls_are_answered(recorder: Recorder) -> None:
    """Each tool_call is followed directly by its tool_result; call ids are unique."""
    names = [name for name, _ in recorder.events]
    call_ids = [data["callId"] for data in recorder.of("tool_call")]
    assert len(set(call_ids)) == len(call_ids)
    for index, name in enumerate(names):
        if name == "tool_call":
            assert names[index + 1] == "tool_result"
            assert recorder.events[index + 1][1]["callId"] == recorder.events[index][1]["callId"]


def test_the_four_presets_are_offered() -> None:
    assert list(TEMPLATES) == ["fullstack-builder", "bot-builder", "content-machine",
                               "research-agent"]


@pytest.mark.parametrize("name", list(TEMPLATES))
async def test_offline_run_builds_and_commits_real_files(tmp_path: Path, name: str) -> None:
    template, recorder, context = TEMPLATES[name], Recorder(), await context_for(tmp_path)
    outcome = await run_agent(template=template, brief=BRIEF,
                              backend=OfflineBackend(template, BRIEF), tools=TOOLS,
                              context=context, emit=recorder.emit)

    assert outcome == RunOutcome("completed")
    steps = template.offline_plan(BRIEF, {})
    assert recorder.events[0] == ("plan", {"steps": [step.title for step in steps],
                                           "revision": 1})
    assert [data["text"] for data in recorder.of("message")] == [step.say for step in steps]
    assert_calls_are_answered(recorder)
    assert [data for data in recorder.of("tool_result") if "error" in data] == []
    assert recorder.of("error") == []

    commits = recorder.of("commit")
    assert len(commits) >= 2
    log = await git(context.workspace, "log", "--format=%H %s")
    assert log == [f"{c['sha']} {c['message']}" for c in reversed(commits)]
    assert await git(context.workspace, "status", "--porcelain") == []
    for commit in commits:
        shown = await git(context.workspace, "show", "--name-only", "--format=", commit["sha"])
        assert sorted(commit["files"]) == sorted(shown)
    tracked = await git(context.workspace, "ls-files")
    for screenshot in recorder.of("screenshot"):
        prefix = "https://flow.example/projects/pizza/files/"
        assert screenshot["url"].startswith(prefix)
        assert screenshot["url"].removeprefix(prefix) in tracked
    await check_template_output(name, context.workspace, tracked, recorder)


async def check_template_output(name: str, workspace: Path, tracked: list[str],
                                recorder: Recorder) -> None:
    if name == "fullstack-builder":
        assert {"index.html", "app.js", "README.md", "server.py"} <= set(tracked)
        assert "<h1>Pizza ordering site for Luigi&#x27;s</h1>" in (
            workspace / "index.html").read_text()
        await trio.run_process([sys.executable, "-m", "py_compile", "server.py"], cwd=workspace)
        assert len(recorder.of("screenshot")) == 1
    elif name == "bot-builder":
        assert {"bot.py", "README.md", "test_bot.py"} <= set(tracked)
        replies = await trio.run_process([sys.executable, "bot.py"], cwd=workspace,
                                         stdin=b"/start\n/topics\nxyzzy\n", capture_stdout=True)
        lines = replies.stdout.decode().splitlines()
        assert lines[0].startswith("Hi! I am Pizza ordering site for Luigi's.")
        assert "pizza" in lines[1] and "/help" in lines[2]
    elif name == "content-machine":
        posts = [path for path in tracked if path.startswith("posts/")]
        assert len(posts) == 3
        assert posts[0].startswith("posts/01-build-a-pizza-ordering-site")
        assert (workspace / posts[1]).read_text().startswith('---\ntitle: "Customers pick')
        assert len(recorder.of("screenshot")) == 1
    else:
        report = (workspace / "report.md").read_text()
        for section in ("## Question", "## Key terms", "## Questions to investigate",
                        "## Findings", "## Method and limitations", "## Next steps"):
            assert section in report
        assert "No sources were consulted" in report


async def test_a_refused_charge_stops_the_run(tmp_path: Path) -> None:
    template, recorder = TEMPLATES["fullstack-builder"], Recorder()
    charged: list[str] = []

    async def charge(tool_name: str, call_id: str) -> None:
        if len(charged) == 2:
            raise RuntimeError("insufficient FLOW balance")
        charged.append(tool_name)

    outcome = await run_agent(template=template, brief=BRIEF,
                              backend=OfflineBackend(template, BRIEF), tools=TOOLS,
                              context=await context_for(tmp_path), emit=recorder.emit,
                              before_tool_call=charge)

    assert outcome.final_status == "failed"
    assert outcome.reason == "tool call 'git_commit' was refused: insufficient FLOW balance"
    assert charged == ["write_file", "write_file"]
    assert [data["tool"] for data in recorder.of("tool_call")] == charged
    assert recorder.events[-1] == ("error", {"message": outcome.reason, "recoverable": False})
    assert recorder.of("commit") == []


def one_step_template(*calls: PlannedCall) -> AgentTemplate:
    return AgentTemplate("test", "test", "test",
                         lambda brief, project: [PlannedStep("Try", "Trying.", list(calls))])


async def test_a_tool_that_raises_gives_an_error_result(tmp_path: Path) -> None:
    async def explode(context: ToolContext, args: JsonObject) -> ToolResult:
        raise ValueError("bug in a plugin tool")

    tools = {**TOOLS, "explode": Tool("explode", "raises", {"type": "object"}, explode)}
    template, recorder = one_step_template(PlannedCall("explode", {}),
                                           PlannedCall("list_files", {})), Recorder()
    outcome = await run_agent(template=template, brief=BRIEF,
                              backend=OfflineBackend(template, BRIEF), tools=tools,
                              context=await context_for(tmp_path), emit=recorder.emit)

    assert outcome == RunOutcome("completed")
    results = recorder.of("tool_result")
    assert results[0] == {"callId": "call-1", "result": None,
                          "error": "tool 'explode' failed: ValueError"}
    assert results[1] == {"callId": "call-2", "result": {"files": []}}


async def test_cancellation_ends_the_run(tmp_path: Path) -> None:
    async def hang(context: ToolContext, args: JsonObject) -> ToolResult:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    tools = {"hang": Tool("hang", "waits forever", {"type": "object"}, hang)}
    template, recorder = one_step_template(PlannedCall("hang", {})), Recorder()
    with trio.move_on_after(0.2) as scope:
        await run_agent(template=template, brief=BRIEF, backend=OfflineBackend(template, BRIEF),
                        tools=tools, context=await context_for(tmp_path), emit=recorder.emit)
        pytest.fail("run_agent returned although it was cancelled")
    assert scope.cancelled_caught
    assert [name for name, _ in recorder.events] == ["plan", "message", "tool_call"]


def turn(text: str, *calls: tuple[str, Any]) -> StreamedTurn:
    return StreamedTurn(text, [(name, args if isinstance(args, str) else json.dumps(args))
                               for name, args in calls])


async def run_with_model(tmp_path: Path, nursery: trio.Nursery, script: list[Any],
                         **options: Any) -> tuple[RunOutcome, Recorder, FakeOpenAI]:
    fake = FakeOpenAI(script)
    base_url = await nursery.start(fake.serve)
    template, recorder = TEMPLATES["fullstack-builder"], Recorder()
    outcome = await run_agent(template=template, brief=BRIEF,
                              backend=OpenAIChatBackend(base_url, "m", "sk-test", timeout=5),
                              tools=TOOLS, context=await context_for(tmp_path), emit=recorder.emit,
                              **options)
    return outcome, recorder, fake


async def test_a_model_drives_a_run(tmp_path: Path, nursery: trio.Nursery) -> None:
    charged: list[str] = []

    async def charge(tool_name: str, call_id: str) -> int:
        charged.append(tool_name)
        return 250_000

    outcome, recorder, fake = await run_with_model(tmp_path, nursery, [
        turn("Plan:\n1. Write the page\n2. Commit it",
             ("write_file", {"path": "index.html", "content": "<h1>Luigi's</h1>"}),
             ("deploy_to_mars", {})),
        turn("New plan:\n1. Write the page\n2. Add styles\n3. Commit it",
             ("write_file", '{"path": "style.css", "content": '),
             ("write_file", {"path": "style.css"}),
             ("git_commit", {"message": "Add the page"})),
        turn("The page is committed."),
    ], before_tool_call=charge)

    assert outcome == RunOutcome("completed")
    assert recorder.of("plan") == [
        {"steps": ["Write the page", "Commit it"], "revision": 1},
        {"steps": ["Write the page", "Add styles", "Commit it"], "revision": 2}]
    assert recorder.events[0][0] == "plan"
    assert recorder.of("message")[-1] == {"role": "assistant", "text": "The page is committed."}
    assert_calls_are_answered(recorder)
    results = recorder.of("tool_result")
    assert results[1]["error"].startswith("unknown tool 'deploy_to_mars'; available tools:")
    assert results[2]["error"] == "arguments are not valid JSON"
    assert results[3]["error"] == "argument 'content' is required"
    assert recorder.of("tool_call")[2]["args"] == '{"path": "style.css", "content": '
    # Only the calls whose tool started are charged, and only they carry their price.
    assert charged == ["write_file", "git_commit"]
    assert [result.get("priceFlow") for result in results] == [
        "0.250000", None, None, None, "0.250000"]
    [commit] = recorder.of("commit")
    assert commit["files"] == ["index.html"]
    assert await git(tmp_path / "ws", "log", "--format=%H") == [commit["sha"]]

    second_request = fake.requests[1].body["messages"]
    assert [message["role"] for message in second_request] == [
        "system", "user", "assistant", "tool", "tool"]
    assert second_request[2]["tool_calls"][1]["function"]["name"] == "deploy_to_mars"
    unknown = second_request[4]
    assert unknown["tool_call_id"] == "fake-1"
    assert "unknown tool 'deploy_to_mars'" in json.loads(unknown["content"])["error"]


async def test_a_failing_model_endpoint_fails_the_run(tmp_path: Path,
                                                      nursery: trio.Nursery) -> None:
    outcome, recorder, _ = await run_with_model(tmp_path, nursery, [
        turn("Looking around.", ("list_files", {})),
        HttpFailure(500, "upstream exploded"),
    ])

    assert outcome.final_status == "failed"
    assert outcome.reason == "model endpoint answered HTTP 500: upstream exploded"
    assert [name for name, _ in recorder.events] == [
        "plan", "message", "tool_call", "tool_result", "error"]
    assert recorder.of("plan") == [{"steps": [BRIEF], "revision": 1}]
    assert recorder.events[-1][1] == {"message": outcome.reason, "recoverable": False}


async def test_a_model_that_never_finishes_hits_the_turn_limit(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    outcome, recorder, fake = await run_with_model(
        tmp_path, nursery, [turn("", ("list_files", {}))] * 3, max_turns=2)

    assert outcome == RunOutcome("failed", "the agent did not finish within 2 turns")
    assert len(fake.requests) == 2
    assert recorder.events[-1] == ("error", {"message": outcome.reason, "recoverable": False})


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_the_project_title_names_what_is_built(name: str) -> None:
    steps = TEMPLATES[name].offline_plan(BRIEF, {"title": "Slice Express"})
    written = [call.args["content"] for step in steps for call in step.calls
               if call.tool == "write_file"]
    assert any("Slice Express" in content for content in written)
    assert not any("Build a pizza ordering site" in step.say for step in steps)
