"""Built-in tools: results and errors the model sees, real screenshots, sandboxed commands.

The escape attempts against the sandbox itself are tests/runtime/test_sandbox.py."""

from __future__ import annotations

import functools
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import trio

from plugins.projects.engine.sandboxed_tools import COMMAND_OUTPUT_LIMIT, sandboxed_tools
from plugins.projects.engine.tools import builtin_tools
from runtime.agents import Tool, ToolContext, ToolResult
from runtime.config import SandboxSettings
from runtime.sandbox import Sandbox
from tests.support.sandbox import git, left_running, probed_sandbox, read_png

TOOLS = {tool.name: tool for tool in [*builtin_tools(), *sandboxed_tools()]}


@pytest.fixture
async def context(tmp_path: Path) -> ToolContext:
    return ToolContext(workspace=tmp_path / "ws", public_base_url="https://flow.example/",
                       project_slug="demo", sandbox=await probed_sandbox())


def commands_allowed(context: ToolContext, timeout: float = 30.0) -> ToolContext:
    return ToolContext(workspace=context.workspace, allow_commands=True,
                       command_timeout=timeout, sandbox=context.sandbox)


async def call(context: ToolContext, name: str, args: Any) -> ToolResult:
    tool: Tool = TOOLS[name]
    return await tool.run(context, args)


def test_builtin_tools_offer_object_schemas() -> None:
    assert list(TOOLS) == ["write_file", "read_file", "list_files", "git_commit",
                           "take_screenshot", "run_command", "start_preview"]
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
    ("take_screenshot", {"width": 10}, "from 200 to 4000"),
    ("take_screenshot", {"command": "npm run dev", "port": 80}, "from 1024 to 65535"),
    ("take_screenshot", {"command": "npm run dev", "path": "x y"}, "URL path"),
    ("take_screenshot", {"command": ""}, "non-empty string"),
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
    assert result.commit.sha == (await git(context.workspace, "rev-parse", "HEAD")).strip()
    assert result.result == {"sha": result.commit.sha, "files": ["a.txt"]}
    again = await call(context, "git_commit", {"message": "Nothing"})
    assert again.error is not None and "nothing to commit" in again.error


COLOURED_PAGE = ("<html><body style='margin:0;background:#0000ff'>"
                 "<div style='width:100px;height:100px;background:#ff0000'></div>"
                 "<script>document.body.style.background = '#00ff00'</script></body></html>")


async def test_screenshot_renders_the_page_in_a_browser(context: ToolContext) -> None:
    missing = await call(context, "take_screenshot", {})
    assert missing.error is not None and "index.html" in missing.error
    await call(context, "write_file", {"path": "index.html", "content": COLOURED_PAGE})

    first = await call(context, "take_screenshot", {"width": 400, "height": 300})
    second = await call(context, "take_screenshot", {"caption": "Full size"})

    assert first.error is None and first.screenshot is not None
    assert first.screenshot.url == (
        "https://flow.example/projects/demo/files/screenshots/index-1.png")
    assert first.screenshot.caption == "index.html at 400x300"
    assert first.result["scripts"] is True
    png = read_png((context.workspace / "screenshots/index-1.png").read_bytes())
    assert (png.width, png.height) == (400, 300)
    assert png.pixel(50, 50) == (255, 0, 0)  # the box
    assert png.pixel(300, 200) == (0, 255, 0)  # the background the page's script set
    assert second.screenshot is not None and second.screenshot.caption == "Full size"
    assert second.screenshot.url.endswith("/files/screenshots/index-2.png")
    header = (context.workspace / "screenshots/index-2.png").read_bytes()[16:24]
    assert struct.unpack(">II", header) == (1280, 800)  # the default viewport


async def test_a_page_that_never_settles_is_shot_without_scripts(context: ToolContext) -> None:
    page = ("<html><body style='margin:0;background:#00ff00'>"
            "<script>document.body.style.background = '#ff0000'; while (true) {}</script>"
            "</body></html>")
    await call(context, "write_file", {"path": "loop.html", "content": page})
    started = trio.current_time()
    result = await call(context, "take_screenshot", {"path": "loop.html", "width": 300,
                                                     "height": 200})
    elapsed = trio.current_time() - started

    assert result.error is None and result.screenshot is not None, result.error
    assert result.result["scripts"] is False
    assert result.screenshot.caption is not None and "scripts disabled" in result.screenshot.caption
    png = read_png((context.workspace / "screenshots/loop-1.png").read_bytes())
    assert png.pixel(150, 100) == (0, 255, 0)  # the script never ran
    assert elapsed < 30 + 10  # the bound, and the margin of a loaded machine


async def test_a_page_reaches_no_loopback_service_of_the_host(context: ToolContext) -> None:
    connections: list[trio.SocketStream] = []
    reached_by_host = trio.Event()

    async def count(stream: trio.SocketStream) -> None:
        connections.append(stream)
        reached_by_host.set()
        await stream.aclose()

    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(functools.partial(trio.serve_tcp, count, 0,
                                                           host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        page = (f"<html><body><img src='http://127.0.0.1:{port}/img'>"
                f"<img src='http://localhost:{port}/img2'>"
                f"<script>fetch('http://127.0.0.1:{port}/fetch')</script></body></html>")
        await call(context, "write_file", {"path": "index.html", "content": page})
        result = await call(context, "take_screenshot", {"width": 300, "height": 200})
        reached = len(connections)
        await (await trio.open_tcp_stream("127.0.0.1", port)).aclose()  # the host reaches it
        await reached_by_host.wait()
        nursery.cancel_scope.cancel()
    assert result.error is None and result.screenshot is not None
    assert reached == 0


async def test_screenshot_of_the_build_dev_server(context: ToolContext) -> None:
    """The dev server runs in its own sandbox and the browser reaches it only through the
    bridge; both are gone when the call ends."""
    await call(context, "write_file", {"path": "site/app.html", "content": COLOURED_PAGE})
    arguments = {"command": "cd site && exec python3 -m http.server 8791 --bind 127.0.0.1",
                 "port": 8791, "path": "/app.html", "width": 300, "height": 200}
    refused = await call(context, "take_screenshot", arguments)  # commands are off
    assert refused.error is not None and "disabled for this project" in refused.error
    result = await call(replace(context, allow_commands=True), "take_screenshot", arguments)
    assert result.error is None and result.screenshot is not None, result.error
    assert result.screenshot.caption == "http://127.0.0.1:8791/app.html at 300x200"
    png = read_png((context.workspace / "screenshots/app-1.png").read_bytes())
    assert png.pixel(50, 50) == (255, 0, 0) and png.pixel(200, 150) == (0, 255, 0)
    assert left_running(context.workspace, b"8791") == []


async def test_a_dev_server_that_never_answers_is_an_error(context: ToolContext) -> None:
    # A browser bound of 9 s gives the server 3 s to answer (a third; 10 s by default).
    sandbox = await probed_sandbox(browser_seconds=9)
    started = trio.current_time()
    result = await call(replace(context, allow_commands=True, sandbox=sandbox),
                        "take_screenshot", {"command": "sleep 2990", "port": 8792})
    assert result.error == "the dev server did not answer on port 8792 within 3 seconds"
    assert trio.current_time() - started < 30
    assert left_running(context.workspace, b"2990") == []


async def test_run_command_is_off_by_default(context: ToolContext) -> None:
    result = await call(context, "run_command", {"command": "touch ran"})
    assert result.error == "run_command is disabled for this project"
    assert not (context.workspace / "ran").exists()


async def test_run_command_reports_what_the_sandbox_did(
    context: ToolContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FLOWSVC_TEST_SECRET", "do-not-leak")
    await call(context, "write_file", {"path": "in.txt", "content": "from the service\n"})
    result = await call(commands_allowed(context), "run_command",
                        {"command": "pwd; cat in.txt; echo made > out.txt; env; "
                                    "echo oops >&2; exit 3"})
    assert result.error is None
    assert result.result["exitCode"] == 3
    assert result.result["timedOut"] is False and result.result["truncated"] is False
    assert 0 <= result.result["durationMs"] < 30_000
    assert result.result["limits"]["network"] == "none"
    assert result.result["limits"]["wallSeconds"] == 30
    output = result.result["output"]
    assert output.splitlines()[:2] == ["/workspace", "from the service"]
    assert "oops" in output and "do-not-leak" not in output
    assert (context.workspace / "out.txt").read_text() == "made\n"


async def test_run_command_truncates_output(context: ToolContext) -> None:
    result = await call(commands_allowed(context), "run_command",
                        {"command": "head -c 50000 /dev/zero | tr '\\0' x"})
    assert result.result["exitCode"] == 0 and result.result["truncated"] is True
    assert result.result["output"] == "x" * COMMAND_OUTPUT_LIMIT


async def test_run_command_timeout_kills_the_whole_command(context: ToolContext) -> None:
    started = trio.current_time()
    result = await call(commands_allowed(context, timeout=1), "run_command",
                        {"command": "echo started; sleep 2999 & wait"})
    elapsed = trio.current_time() - started

    assert result.error == "command timed out after 1 seconds"
    assert result.result["exitCode"] is None and result.result["timedOut"] is True
    assert result.result["output"] == "started\n"
    assert elapsed < 10
    assert left_running(context.workspace, b"2999") == []


async def test_without_a_sandbox_nothing_runs(tmp_path: Path) -> None:
    disabled = Sandbox(SandboxSettings(active=False))
    await disabled.probe()
    assert disabled.reasons == {"commands": "turned off by [sandbox] active = false",
                                "browser": "turned off by [sandbox] active = false"}
    for sandbox in (disabled, None):
        context = ToolContext(workspace=tmp_path / "ws", allow_commands=True, sandbox=sandbox)
        await call(context, "write_file", {"path": "index.html", "content": COLOURED_PAGE})
        ran = await call(context, "run_command", {"command": "touch ran"})
        shot = await call(context, "take_screenshot", {})
        assert ran.error is not None and shot.error is not None
        assert ran.result is None and shot.screenshot is None
        assert not (context.workspace / "ran").exists()
        assert not (context.workspace / "screenshots").exists()
