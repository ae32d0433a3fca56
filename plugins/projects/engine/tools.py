"""The built-in agent tools that need no sandbox: files and commits.

Each tool works only inside ``ToolContext.workspace`` through :class:`Workspace`. A
refused path, a git failure or a bad argument comes back as ``ToolResult(error=...)``
so the model can see it and recover; no such failure escapes as an exception. The tools
that run programs are in ``sandboxed_tools``.
"""

from __future__ import annotations

import functools

from plugins.projects.engine.workspace import Workspace, WorkspaceError
from runtime.agents import JsonObject, Tool, ToolContext, ToolFunction, ToolResult
from runtime.errors import ServiceError


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
        except ServiceError as exc:  # the sandbox refusing or failing
            return ToolResult(error=exc.message)
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


def _object_schema(properties: JsonObject, required: list[str]) -> JsonObject:
    return {"type": "object", "properties": properties, "required": required,
            "additionalProperties": False}


_PATH = {"type": "string", "description": "path relative to the project workspace"}


def builtin_tools() -> list[Tool]:
    """Return the built-in tools that need no sandbox, in the order they are offered."""
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
    ]
