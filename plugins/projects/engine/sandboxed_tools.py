"""The tools that run programs: ``run_command``, ``take_screenshot`` and ``start_preview``,
all in the sandbox.

They go through ``ToolContext.sandbox`` (``runtime.sandbox``): a command runs under
bubblewrap as the work tree's sandbox uid with no network, and a screenshot is taken by
Chromium in its own network-less sandbox. Where the sandbox could not be set up they are
not offered (``Tool.needs``) and, called anyway, answer an error: nothing ever runs on the
host, and no picture is ever faked.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import PurePosixPath
from urllib.parse import quote

import trio

from plugins.projects.engine.ending import preview_url
from plugins.projects.engine.tools import (
    _PATH,
    ToolArgumentError,
    _object_schema,
    _reporting_failures,
    _string_argument,
)
from plugins.projects.engine.workspace import Workspace, WorkspaceError
from runtime.agents import JsonObject, ScreenshotInfo, Tool, ToolContext, ToolResult
from runtime.sandbox import DevServer, Sandbox
from runtime.sandbox.jail import WORK_TREE

COMMAND_OUTPUT_LIMIT = 8000
SCREENSHOT_DIRECTORY = "screenshots"
VIEWPORT = (1280, 800)
_SIDE = {"type": "integer", "minimum": 200, "maximum": 4000}


def _sandbox(context: ToolContext) -> Sandbox:
    if context.sandbox is None:
        raise ToolArgumentError("this service runs no sandbox, so no program can run")
    return context.sandbox


@_reporting_failures
async def _run_command(context: ToolContext, args: JsonObject) -> ToolResult:
    if not context.allow_commands:
        return ToolResult(error="run_command is disabled for this project")
    command = _string_argument(args, "command")
    if not command.strip():
        raise ToolArgumentError("argument 'command' is empty")
    sandbox = _sandbox(context)
    await Workspace(context.workspace).ensure_repository()
    limits = replace(sandbox.limits, wall_seconds=context.command_timeout)
    outcome = await sandbox.run(["sh", "-c", command], context.workspace, limits=limits)
    result = {
        "exitCode": outcome.exit_code,
        "output": outcome.output[:COMMAND_OUTPUT_LIMIT].decode("utf-8", "replace"),
        "durationMs": outcome.duration_ms,
        "timedOut": outcome.timed_out,
        "truncated": outcome.truncated or len(outcome.output) > COMMAND_OUTPUT_LIMIT,
        "limits": outcome.limits.described(),
        "workspaceBytes": outcome.workspace_bytes,
    }
    error = None
    if outcome.timed_out:
        error = f"command timed out after {limits.wall_seconds:g} seconds"
    elif outcome.workspace_bytes > limits.workspace_bytes:
        error = (f"the work tree now holds {outcome.workspace_bytes} bytes, over its cap of "
                 f"{limits.workspace_bytes}: delete files before running more")
    return ToolResult(result=result, error=error)


def _side(args: JsonObject, name: str, default: int) -> int:
    value = args.get(name, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 200 <= value <= 4000:
        raise ToolArgumentError(f"argument {name!r} must be an integer from 200 to 4000")
    return value


def _dev_server(args: JsonObject, command: object) -> DevServer:
    if not isinstance(command, str) or not command.strip():
        raise ToolArgumentError("argument 'command' must be a non-empty string")
    port = args.get("port", 3000)
    if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port <= 65535:
        raise ToolArgumentError("argument 'port' must be an integer from 1024 to 65535")
    return DevServer(command, port)


def _page(args: JsonObject) -> tuple[str, DevServer | None]:
    """The URL the browser loads, and the dev server to start first, if any."""
    command = args.get("command")
    if command is None:
        return "", None
    server = _dev_server(args, command)
    path = _string_argument(args, "path", default="/")
    if not path.startswith("/") or any(c in path for c in "\r\n\0 "):
        raise ToolArgumentError("argument 'path' must be a URL path starting with '/'")
    return f"http://127.0.0.1:{server.port}{path}", server


@_reporting_failures
async def _take_screenshot(context: ToolContext, args: JsonObject) -> ToolResult:
    width, height = _side(args, "width", VIEWPORT[0]), _side(args, "height", VIEWPORT[1])
    workspace = Workspace(context.workspace)
    await workspace.ensure_repository()
    page_url, server = _page(args)
    if server is not None and not context.allow_commands:
        return ToolResult(error="take_screenshot with a command is disabled for this project "
                                "(it runs commands)")
    page_path = _string_argument(args, "path", default="/" if server else "index.html")
    if server is None:
        page = workspace.resolve(page_path)
        if not await trio.Path(page).is_file():
            raise WorkspaceError(f"file {page_path!r} does not exist")
        relative = page.relative_to(context.workspace.resolve()).as_posix()
        page_url = f"file://{WORK_TREE}/{quote(relative)}"
    picture = await _sandbox(context).screenshot(context.workspace, page_url, width=width,
                                                 height=height, server=server)
    existing = [name for name in await workspace.list_files()
                if name.startswith(f"{SCREENSHOT_DIRECTORY}/")]
    stem = PurePosixPath(page_path).stem or "index"
    picture_path = f"{SCREENSHOT_DIRECTORY}/{stem}-{len(existing) + 1}.png"
    await workspace.write_file(picture_path, picture.png)
    base = context.public_base_url.rstrip("/")
    url = f"{base}/projects/{context.project_slug}/files/{picture_path}"
    caption = args.get("caption")
    if not isinstance(caption, str) or not caption.strip():
        caption = f"{page_url if server else page_path} at {width}x{height}"
    if not picture.scripts:
        caption += " (scripts disabled: the page did not settle with them)"
    return ToolResult(result={"path": picture_path, "url": url, "width": width,
                              "height": height, "scripts": picture.scripts,
                              "durationMs": picture.duration_ms},
                      screenshot=ScreenshotInfo(url=url, caption=caption,
                                                 path=picture_path))


@_reporting_failures
async def _start_preview(context: ToolContext, args: JsonObject) -> ToolResult:
    if not context.allow_commands:
        return ToolResult(error="start_preview is disabled for this project")
    server = _dev_server(args, args.get("command"))
    if context.run_nursery is None:
        raise ToolArgumentError("start_preview needs a run to live in")
    await Workspace(context.workspace).ensure_repository()
    live = await context.run_nursery.start(_sandbox(context).serve, context.workspace, server)
    url = preview_url(context.public_base_url, context.project_slug)
    return ToolResult(result={"url": url, "port": live.server.port,
                              "command": live.server.command})


def sandboxed_tools() -> list[Tool]:
    """The tools that need the sandbox, in the order they are offered to models."""
    return [
        Tool("take_screenshot",
             "Render an HTML page of the workspace in a real browser (Chromium, no network; "
             "the visible area of a 1280x800 viewport unless told) and publish the PNG.",
             _object_schema({"path": {**_PATH, "default": "index.html"},
                            "width": {**_SIDE, "default": VIEWPORT[0]},
                            "height": {**_SIDE, "default": VIEWPORT[1]},
                            "caption": {"type": "string"}}, []),
             _take_screenshot, needs="browser"),
        Tool("run_command",
             "Run a shell command in the workspace, in a sandbox without network and within "
             "CPU, memory, process, file, time and output limits; output is truncated.",
             _object_schema({"command": {"type": "string"}}, ["command"]), _run_command,
             needs="commands"),
        Tool("start_preview",
             "Start the build's own HTTP server (a shell command listening on 127.0.0.1:port "
             "in the sandbox, no network) for the live preview until the run ends; a second "
             "call replaces the first server. Answers once the server answers.",
             _object_schema({"command": {"type": "string"},
                             "port": {"type": "integer", "minimum": 1024, "maximum": 65535,
                                      "default": 3000}}, ["command"]),
             _start_preview, needs="commands"),
    ]
