"""Built-in tools: results and errors the model sees, screenshots, guarded commands."""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Any

import pytest
import trio

from plugins.projects.engine.tools import COMMAND_OUTPUT_LIMIT, builtin_tools
from runtime.agents import Tool, ToolContext, ToolResult

TOOLS = {tool.name: tool for tool in builtin_tools()}


@pytest.fixture
def context(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path / "ws", public_base_url="https://flow.example/",
                       project_slug="demo")


async def call(context: ToolContext, name: str, args: Any) -> ToolResult:
    tool: Tool = TOOLS[name]
    return await tool.run(context, args)


def test_builtin_tools_offer_object_schemas() -> None:
    assert list(TOOLS) == ["write_file", "read_file", "list_files", "git_commit",
                           "take_screenshot", "run_command"]
    for tool in TOOLS.values():
        assert tool.parameters["type"] == "object"
        assert set(tool.parameters["required"]) <= set(tool.parameters["properties"])
        assert tool.description


async def test_file_tools_round_trip(context: ToolContext) -> None:
    written = await call(context, "write_file", {"path": "src/main.py", "content": "print(1)\n"})
    assert written == ToolResult(result={"path": "src/main.py", "bytes": 9})
    read = await call(context, "read_file", {"path": "src/main.py"})
    assert read.result == {"path": "src/main.py", "content": "print(1)\n", "truncated": False}
    listed = await call(context, "list_files", {})
    assert listed.result == {"files": ["src/main.py"]}


@pytest.mark.parametrize(("name", "args", "message"), [
    ("write_file", {"content": "x"}, "'path' is required"),
    ("write_file", {"path": "a.txt", "content": 3}, "'content' must be a string"),
    ("write_file", ["a.txt"], "JSON object"),
    ("read_file", {"path": "../../etc/passwd"}, "leaves the workspace"),
    ("read_file", {"path": "nothing.txt"}, "does not exist"),
    ("git_commit", {}, "'message' is required"),
    ("take_screenshot", {"path": 7}, "must be a string"),
    ("run_command", {"command": "true"}, "disabled"),
])
async def test_bad_calls_return_errors(
    context: ToolContext, name: str, args: Any, message: str
) -> None:
    result = await call(context, name, args)
    assert result.error is not None and message in result.error
    assert result.commit is None and result.screenshot is None


async def test_writing_over_a_directory_is_an_error(context: ToolContext) -> None:
    await call(context, "write_file", {"path": "dir/a.txt", "content": "a"})
    result = await call(context, "write_file", {"path": "dir", "content": "x"})
    assert result.error == "path 'dir' is a directory"


async def test_git_commit_reports_the_commit(context: ToolContext) -> None:
    await call(context, "write_file", {"path": "a.txt", "content": "a"})
    result = await call(context, "git_commit", {"message": "Add a"})
    assert result.commit is not None
    head = await trio.run_process(["git", "rev-parse", "HEAD"], cwd=context.workspace,
                                  capture_stdout=True)
    assert result.commit.sha == head.stdout.decode().strip()
    assert result.result == {"sha": result.commit.sha, "files": ["a.txt"]}
    again = await call(context, "git_commit", {"message": "Nothing"})
    assert again.error is not None and "nothing to commit" in again.error


async def test_screenshot_draws_the_page_outline(context: ToolContext) -> None:
    missing = await call(context, "take_screenshot", {})
    assert missing.error is not None and "index.html" in missing.error
    page = ("<html><head><title>Pizza &amp; Co</title></head><body><h1>Order pizza</h1>"
            "<p>ignored</p><h2>Menu</h2><h3>Margherita <em>classic</em></h3></body></html>")
    await call(context, "write_file", {"path": "index.html", "content": page})

    first = await call(context, "take_screenshot", {})
    second = await call(context, "take_screenshot", {"caption": "After the menu"})

    assert first.screenshot is not None and second.screenshot is not None
    assert first.screenshot.url == (
        "https://flow.example/projects/demo/files/screenshots/index-1.svg")
    assert second.screenshot.url.endswith("/files/screenshots/index-2.svg")
    assert second.screenshot.caption == "After the menu"
    # The SVG is the tool's own output; parsing it checks that it is well-formed XML.
    svg = ElementTree.fromstring(  # noqa: S314
        (context.workspace / "screenshots/index-1.svg").read_text())
    texts = [element.text for element in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert texts == ["Pizza & Co", "index.html", "Order pizza", "Menu", "Margherita classic"]


async def test_run_command_is_off_by_default(context: ToolContext) -> None:
    result = await call(context, "run_command", {"command": "touch ran"})
    assert result.error == "run_command is disabled for this project"
    assert not (context.workspace / "ran").exists()


async def test_run_command_runs_in_the_workspace_without_service_secrets(
    context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSVC_TEST_SECRET", "do-not-leak")
    allowed = ToolContext(workspace=context.workspace, allow_commands=True)
    result = await call(allowed, "run_command",
                        {"command": "pwd; env; echo oops >&2; exit 3"})
    assert result.error is None
    assert result.result["exitCode"] == 3
    output = result.result["output"]
    assert output.splitlines()[0] == str(context.workspace)
    assert "oops" in output
    assert "do-not-leak" not in output


async def test_run_command_truncates_output(context: ToolContext) -> None:
    allowed = ToolContext(workspace=context.workspace, allow_commands=True)
    result = await call(allowed, "run_command", {"command": "head -c 50000 /dev/zero | tr '\\0' x"})
    assert result.result == {"exitCode": 0, "output": "x" * COMMAND_OUTPUT_LIMIT,
                             "truncated": True}


def _process_is_gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


async def test_run_command_timeout_kills_the_whole_command(context: ToolContext) -> None:
    allowed = ToolContext(workspace=context.workspace, allow_commands=True, command_timeout=0.3)
    started = trio.current_time()
    result = await call(allowed, "run_command",
                        {"command": "echo started; sleep 30 & echo $! > child.pid; wait"})
    elapsed = trio.current_time() - started

    assert result.error == "command timed out after 0.3 seconds"
    assert result.result == {"exitCode": None, "output": "started\n", "truncated": False}
    assert elapsed < 3
    child = int((context.workspace / "child.pid").read_text())
    for _ in range(100):  # the orphaned child is reaped by init, which can take a moment
        if _process_is_gone(child):
            break
        await trio.sleep(0.02)
    assert _process_is_gone(child), "the background child outlived the timeout"
