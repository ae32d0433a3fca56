"""The built-in agent tools: files, commits, screenshots and (when allowed) commands.

Each tool works only inside ``ToolContext.workspace`` through :class:`Workspace`. A
refused path, a git failure or a bad argument comes back as ``ToolResult(error=...)``
so the model can see it and recover; no such failure escapes as an exception.
"""

from __future__ import annotations

import functools
import html
import os
import signal
import subprocess
from collections.abc import Sequence
from html.parser import HTMLParser
from pathlib import PurePosixPath

import trio

from plugins.projects.engine.workspace import Workspace, WorkspaceError
from runtime.agents import JsonObject, ScreenshotInfo, Tool, ToolContext, ToolFunction, ToolResult

COMMAND_OUTPUT_LIMIT = 8000
SCREENSHOT_DIRECTORY = "screenshots"


class ToolArgumentError(Exception):
    """Raised inside a tool when the model passed a missing or mistyped argument."""


def _string_argument(args: JsonObject, name: str, *, default: str | None = None) -> str:
    value = args.get(name, default)
    if not isinstance(value, str):
        expected = "is required" if value is None else "must be a string"
        raise ToolArgumentError(f"argument {name!r} {expected}")
    return value


def _reporting_failures(function: ToolFunction) -> ToolFunction:
    """Turn the expected failures of a tool into ``ToolResult(error=...)``."""

    @functools.wraps(function)
    async def run(context: ToolContext, args: JsonObject) -> ToolResult:
        if not isinstance(args, dict):
            return ToolResult(error="arguments must be a JSON object")
        try:
            return await function(context, args)
        except (ToolArgumentError, WorkspaceError) as exc:
            return ToolResult(error=str(exc))
        except OSError as exc:
            return ToolResult(error=f"file system error: {exc.strerror or exc}")

    return run


@_reporting_failures
async def _write_file(context: ToolContext, args: JsonObject) -> ToolResult:
    path = _string_argument(args, "path")
    size = await Workspace(context.workspace).write_file(path, _string_argument(args, "content"))
    return ToolResult(result={"path": path, "bytes": size})


@_reporting_failures
async def _read_file(context: ToolContext, args: JsonObject) -> ToolResult:
    path = _string_argument(args, "path")
    text, truncated = await Workspace(context.workspace).read_file(path)
    return ToolResult(result={"path": path, "content": text, "truncated": truncated})


@_reporting_failures
async def _list_files(context: ToolContext, args: JsonObject) -> ToolResult:
    return ToolResult(result={"files": await Workspace(context.workspace).list_files()})


@_reporting_failures
async def _git_commit(context: ToolContext, args: JsonObject) -> ToolResult:
    commit = await Workspace(context.workspace).commit(_string_argument(args, "message"))
    return ToolResult(result={"sha": commit.sha, "files": commit.files}, commit=commit)


class _PageOutline(HTMLParser):
    """Collects the ``<title>`` and the h1-h3 headings of an HTML page, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.title = ""
        self.headings: list[tuple[str, str]] = []
        self._open_tag: str | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in {"title", "h1", "h2", "h3"}:
            self._open_tag, self._text = tag, []

    def handle_data(self, data: str) -> None:
        if self._open_tag is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag != self._open_tag:
            return
        text = " ".join("".join(self._text).split())
        if tag == "title":
            self.title = text
        elif text:
            self.headings.append((tag, text))
        self._open_tag = None


def render_page_outline_svg(page: str, source_path: str) -> str:
    """Draw an SVG of a page's title bar and headings, the way a browser would lay them out.

    It is an honest sketch, not a browser screenshot: only the title and h1-h3 headings
    are drawn.
    """
    outline = _PageOutline()
    outline.feed(page)
    sizes = {"h1": 30, "h2": 22, "h3": 18}
    width, y = 800, 110
    lines: list[str] = []
    for tag, text in outline.headings[:14]:
        size = sizes[tag]
        y += size + 14
        lines.append(f'<text x="40" y="{y}" font-size="{size}" font-weight="bold" '
                     f'fill="#1f2933">{html.escape(text[:70])}</text>')
    height = max(y + 50, 300)
    title = html.escape((outline.title or source_path)[:80])
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" font-family="sans-serif">',
        f'<rect width="{width}" height="{height}" fill="#ffffff" stroke="#9aa5b1"/>',
        f'<rect width="{width}" height="44" fill="#e4e7eb"/>',
        '<circle cx="22" cy="22" r="6" fill="#ef4e4e"/><circle cx="42" cy="22" r="6" '
        'fill="#f7c948"/><circle cx="62" cy="22" r="6" fill="#3ebd93"/>',
        f'<text x="90" y="28" font-size="15" fill="#323f4b">{title}</text>',
        f'<text x="40" y="80" font-size="12" fill="#7b8794">{html.escape(source_path)}</text>',
        *lines,
        "</svg>",
        "",
    ])


@_reporting_failures
async def _take_screenshot(context: ToolContext, args: JsonObject) -> ToolResult:
    page_path = _string_argument(args, "path", default="index.html")
    workspace = Workspace(context.workspace)
    page, _ = await workspace.read_file(page_path, max_bytes=1_000_000)
    existing = [name for name in await workspace.list_files()
                if name.startswith(f"{SCREENSHOT_DIRECTORY}/")]
    stem = PurePosixPath(page_path).stem
    picture_path = f"{SCREENSHOT_DIRECTORY}/{stem}-{len(existing) + 1}.svg"
    await workspace.write_file(picture_path, render_page_outline_svg(page, page_path))
    base = context.public_base_url.rstrip("/")
    url = f"{base}/projects/{context.project_slug}/files/{picture_path}"
    caption = args.get("caption")
    if not isinstance(caption, str) or not caption.strip():
        caption = f"Outline of {page_path}: title and headings"
    return ToolResult(result={"path": picture_path, "url": url},
                      screenshot=ScreenshotInfo(url=url, caption=caption))


async def _kill_process_group(process: trio.Process) -> None:
    # The command runs under ``sh -c`` in its own session: killing only the shell
    # would leave its children running and holding the output pipe open.
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        return


def _command_environment(workspace: str) -> dict[str, str]:
    # The service's own environment holds credentials; commands get only what a
    # build needs.
    return {"PATH": os.environ.get("PATH", os.defpath), "HOME": workspace, "LANG": "C.UTF-8"}


class _BoundedOutput:
    """Keeps the first ``limit`` bytes of a command's output and counts the rest."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = bytearray()
        self.total = 0

    def feed(self, chunk: bytes | bytearray) -> None:
        self.total += len(chunk)
        self.kept.extend(chunk[: max(self.limit - len(self.kept), 0)])

    def as_result(self, exit_code: int | None) -> JsonObject:
        return {"exitCode": exit_code, "output": self.kept.decode("utf-8", "replace"),
                "truncated": self.total > len(self.kept)}


async def _run_streaming(argv: Sequence[str], cwd: str, output: _BoundedOutput) -> int:
    """Run ``argv`` in its own session, feeding its merged output to ``output``.

    Cancelling the call kills the whole process group.

    :return: the exit status.
    """
    async with trio.open_nursery() as nursery:
        process: trio.Process = await nursery.start(functools.partial(
            trio.run_process, list(argv), cwd=cwd, env=_command_environment(cwd),
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            check=False, start_new_session=True, deliver_cancel=_kill_process_group))
        assert process.stdout is not None  # stdout=PIPE above
        async for chunk in process.stdout:
            output.feed(chunk)
    return await process.wait()


@_reporting_failures
async def _run_command(context: ToolContext, args: JsonObject) -> ToolResult:
    if not context.allow_commands:
        return ToolResult(error="run_command is disabled for this project")
    command = _string_argument(args, "command")
    if not command.strip():
        raise ToolArgumentError("argument 'command' is empty")
    await Workspace(context.workspace).ensure_repository()
    output = _BoundedOutput(COMMAND_OUTPUT_LIMIT)
    with trio.move_on_after(context.command_timeout):
        exit_code = await _run_streaming(["sh", "-c", command], str(context.workspace), output)
        return ToolResult(result=output.as_result(exit_code))
    return ToolResult(result=output.as_result(None),
                      error=f"command timed out after {context.command_timeout:g} seconds")


def _object_schema(properties: JsonObject, required: list[str]) -> JsonObject:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


_PATH = {"type": "string", "description": "path relative to the project workspace"}


def builtin_tools() -> list[Tool]:
    """Return the platform's built-in tools, in the order they are offered to models."""
    return [
        Tool("write_file", "Create or overwrite a UTF-8 text file in the project workspace.",
             _object_schema({"path": _PATH, "content": {"type": "string"}}, ["path", "content"]),
             _write_file),
        Tool("read_file", "Read a UTF-8 text file of the project workspace (first 64 KiB).",
             _object_schema({"path": _PATH}, ["path"]), _read_file),
        Tool("list_files", "List every file of the project workspace.",
             _object_schema({}, []), _list_files),
        Tool("git_commit", "Commit every change in the workspace with a message.",
             _object_schema({"message": {"type": "string"}}, ["message"]), _git_commit),
        Tool("take_screenshot",
             "Draw the title and headings of an HTML page of the workspace as an SVG picture "
             "and publish its URL.",
             _object_schema({"path": {**_PATH, "default": "index.html"},
                             "caption": {"type": "string"}}, []),
             _take_screenshot),
        Tool("run_command",
             "Run a shell command in the workspace (only when the project allows commands); "
             "output is truncated.",
             _object_schema({"command": {"type": "string"}}, ["command"]), _run_command),
    ]
