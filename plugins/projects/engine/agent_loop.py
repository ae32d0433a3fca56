"""The agent loop: turns of a model backend, tool calls, and the project stream events.

``run_agent`` owns one run's conversation. It asks the backend for a turn, runs the
turn's tool calls one by one and feeds their results back, until the model finishes,
fails, or a charge before a tool call is refused. Every step is reported through
``emit`` as the Project stream events of the spec (all but ``done``, which the caller
emits with the run id once this returns).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

import trio

from plugins.projects.engine.model_backends import (
    ConversationMessage,
    ModelBackend,
    ModelBackendError,
    ToolCallRequest,
)
from runtime.agents import AgentTemplate, Tool, ToolContext, ToolResult
from runtime.contracts.runs import BeforeToolCall
from runtime.wire import format_flow

logger = logging.getLogger(__name__)

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
# The key of a ``screenshot`` event's data that names the picture's work-tree path, for the
# publisher to store the file with the event; it is not published (the spec's event is
# ``{url, caption?}``).
SCREENSHOT_PATH = "_path"

_PLAN_LINE = re.compile(r"^\s*(?:\d+[.)]|[-*])\s+(?P<title>\S.*?)\s*$")
_STEP_TITLE_LIMIT = 120


@dataclass(frozen=True)
class RunOutcome:
    """How a run ended: ``completed``, or ``failed`` with the reason."""

    final_status: Literal["completed", "failed"]
    reason: str | None = None


def _plan_from_text(text: str) -> list[str]:
    """Return the steps of a numbered or bulleted list in ``text`` (none under two items)."""
    steps = [match["title"][:_STEP_TITLE_LIMIT] for line in text.splitlines()
             if (match := _PLAN_LINE.match(line))]
    return steps if len(steps) >= 2 else []


def _one_step_plan(brief: str) -> list[str]:
    summary = " ".join(brief.split())
    if len(summary) > _STEP_TITLE_LIMIT:
        summary = summary[: _STEP_TITLE_LIMIT - 3].rstrip() + "..."
    return [summary or "Build the project"]


class _Run:
    """One run's state: the conversation, the plan, the call counter."""

    def __init__(self, template: AgentTemplate, brief: str, backend: ModelBackend,
                 tools: Mapping[str, Tool], context: ToolContext, emit: Emit,
                 before_tool_call: BeforeToolCall | None) -> None:
        self.backend = backend
        self.tools = tools
        self.context = context
        self.emit = emit
        self.before_tool_call = before_tool_call
        self.brief = brief
        self.conversation = [ConversationMessage("system", template.system_prompt),
                             ConversationMessage("user", brief)]
        self.plan: list[str] = []
        self.plan_revision = 0
        self.calls_made = 0

    async def fail(self, reason: str) -> RunOutcome:
        await self.emit("error", {"message": reason, "recoverable": False})
        return RunOutcome("failed", reason)

    async def update_plan(self, text: str) -> None:
        """Emit the first plan, or a new revision when the model states a different one."""
        fixed_steps = self.backend.planned_steps()
        steps = _plan_from_text(text)
        if self.plan_revision == 0:
            steps = fixed_steps or steps or _one_step_plan(self.brief)
        elif fixed_steps is not None or not steps or steps == self.plan:
            return
        self.plan = steps
        self.plan_revision += 1
        await self.emit("plan", {"steps": steps, "revision": self.plan_revision})

    async def call_tool(self, request: ToolCallRequest) -> str | None:
        """Run one requested call and emit its events.

        :return: the reason to stop the run when ``before_tool_call`` refused the call,
            otherwise None.
        """
        self.calls_made += 1
        call_id = f"call-{self.calls_made}"
        tool = self.tools.get(request.name)
        args, args_error = _parse_arguments(request.arguments)
        if tool is not None and args is not None:
            args_error = arguments_error(tool.parameters, args)
            if args_error is not None:
                args = None
        price: int | None = None
        if tool is not None and args is not None and self.before_tool_call is not None:
            try:
                price = await self.before_tool_call(request.name, call_id)
            except Exception as exc:
                return f"tool call {request.name!r} was refused: {str(exc) or type(exc).__name__}"
        await self.emit("tool_call", {"tool": request.name,
                                      "args": request.arguments if args is None else args,
                                      "callId": call_id})
        if tool is None:
            known = ", ".join(sorted(self.tools)) or "none"
            result = ToolResult(error=f"unknown tool {request.name!r}; available tools: {known}")
        elif args is None:
            result = ToolResult(error=args_error)
        else:
            result = await self._run_tool(tool, args)
        await self._report(call_id, result, price)
        self.conversation.append(ConversationMessage(
            "tool", _result_text(result), call_id=request.id))
        return None

    async def _run_tool(self, tool: Tool, args: dict[str, Any]) -> ToolResult:
        try:
            return await tool.run(self.context, args)
        except Exception as exc:
            # A plugin's tool with a bug must not end the run: the model sees the
            # failure like any other tool error and can work around it.
            logger.exception("tool %s raised", tool.name)
            return ToolResult(error=f"tool {tool.name!r} failed: {type(exc).__name__}")

    async def _report(self, call_id: str, result: ToolResult, price: int | None) -> None:
        data: dict[str, Any] = {"callId": call_id, "result": result.result}
        if price is not None:
            data["priceFlow"] = format_flow(price)
        if result.error is not None:
            data["error"] = result.error
        await self.emit("tool_result", data)
        if result.commit is not None:
            await self.emit("commit", {"sha": result.commit.sha, "message": result.commit.message,
                                       "files": list(result.commit.files)})
        if result.screenshot is not None:
            shot: dict[str, Any] = {"url": result.screenshot.url}
            if result.screenshot.caption is not None:
                shot["caption"] = result.screenshot.caption
            if result.screenshot.path is not None:
                shot[SCREENSHOT_PATH] = result.screenshot.path  # the publisher takes it out
            await self.emit("screenshot", shot)


def _parse_arguments(arguments: str) -> tuple[dict[str, Any] | None, str | None]:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return None, "arguments are not valid JSON"
    if not isinstance(parsed, dict):
        return None, "arguments must be a JSON object"
    return parsed, None


def _result_text(result: ToolResult) -> str:
    reply: dict[str, Any] = {"result": result.result}
    if result.error is not None:
        reply["error"] = result.error
    return json.dumps(reply, default=str)


async def run_agent(
    *,
    template: AgentTemplate,
    brief: str,
    backend: ModelBackend,
    tools: Mapping[str, Tool],
    context: ToolContext,
    emit: Emit,
    before_tool_call: BeforeToolCall | None = None,
    max_turns: int = 40,
) -> RunOutcome:
    """Run an agent on ``brief`` until the model finishes, and stream what happens.

    Emits ``plan`` (before anything else the model did), then per turn ``message``
    (when the model said something) and, per call, ``tool_call`` then ``tool_result``,
    followed by ``commit`` or ``screenshot`` when the tool made one. A call of an
    unknown tool or with arguments that do not fit the tool's schema gets an error result
    and the run goes on; it never reaches ``before_tool_call``.
    ``before_tool_call(tool_name, call_id)`` is awaited before each call that will start
    (whatever its outcome then); if it raises, the run stops. The price it returns is
    ``priceFlow`` of the call's ``tool_result``.

    :return: ``completed`` when the model finished; ``failed`` with the reason (also
        emitted as ``error`` with ``recoverable: false``) when the backend failed, a
        charge was refused, or ``max_turns`` turns passed.
    :raises trio.Cancelled: never swallowed; the caller's cancellation ends the run.
    """
    # What tools start for the run (a preview server) lives in this nursery and is cancelled
    # when the run returns, fails or is cancelled; the run's own failures are carried out of
    # it as they are, not wrapped in an exception group.
    failure: Exception | None = None
    async with trio.open_nursery() as nursery:
        try:
            outcome = await _converse(
                _Run(template, brief, backend, tools, replace(context, run_nursery=nursery),
                     emit, before_tool_call), max_turns)
        except Exception as exc:
            failure = exc
        finally:
            nursery.cancel_scope.cancel()
    if failure is not None:
        raise failure
    return outcome


async def _converse(run: _Run, max_turns: int) -> RunOutcome:
    backend, emit = run.backend, run.emit
    offered = list(run.tools.values())
    for _ in range(max_turns):
        try:
            turn = await backend.next_turn(run.conversation, offered)
        except ModelBackendError as exc:
            return await run.fail(str(exc))
        await run.update_plan(turn.text)
        if turn.text:
            await emit("message", {"role": "assistant", "text": turn.text})
        run.conversation.append(ConversationMessage("assistant", turn.text, tuple(turn.calls)))
        if turn.finished:
            return RunOutcome("completed")
        for request in turn.calls:
            refusal = await run.call_tool(request)
            if refusal is not None:
                return await run.fail(refusal)
    return await run.fail(f"the agent did not finish within {max_turns} turns")


_JSON_TYPES: dict[str, tuple[type, ...]] = {
    "string": (str,), "integer": (int,), "number": (int, float), "boolean": (bool,),
    "object": (dict,), "array": (list,), "null": (type(None),)}


def arguments_error(schema: Mapping[str, Any], args: dict[str, Any]) -> str | None:
    """Why ``args`` do not fit a tool's object ``schema``, or None when they do.

    The checks a call must pass before its tool starts (and is charged): required
    properties, no unknown ones when ``additionalProperties`` is false, and each known
    property's JSON type. Deeper rules are the tool's to report.
    """
    properties: Mapping[str, Any] = schema.get("properties") or {}
    missing = [name for name in schema.get("required") or [] if name not in args]
    if missing:
        return f"argument {missing[0]!r} is required"
    if schema.get("additionalProperties") is False:
        unknown = sorted(name for name in args if name not in properties)
        if unknown:
            return f"unknown argument {unknown[0]!r}"
    for name, value in args.items():
        expected = properties.get(name, {}).get("type")
        types = _JSON_TYPES.get(expected) if isinstance(expected, str) else None
        if types is None:
            continue
        if isinstance(value, bool) and expected != "boolean" or not isinstance(value, types):
            return f"argument {name!r} must be of type {expected}"
    return None
