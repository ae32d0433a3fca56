"""Model backends: what decides the next tool calls of an agent run.

A backend is turn-based: given the conversation so far and the tools on offer, it
returns the assistant's text and the tool calls of the next turn; a turn without calls
means the model is finished. The agent loop owns the conversation and the tools; a
backend owns only its connection to the model.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import httpx
import trio

from runtime.agents import AgentTemplate, JsonObject, PlannedStep, Tool


class ModelBackendError(Exception):
    """Raised when the model cannot produce a turn: an HTTP error, a timeout, an
    unreachable endpoint or a malformed reply. The message never contains the API key."""


@dataclass(frozen=True)
class ToolCallRequest:
    """One tool call the model asked for.

    ``arguments`` is the JSON text exactly as the model produced it; the agent loop parses
    it, so malformed arguments reach the model as a tool error it can correct.
    """

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ModelTurn:
    """The model's next turn: what it says and the calls it makes (none means finished)."""

    text: str
    calls: list[ToolCallRequest] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return not self.calls


@dataclass(frozen=True)
class ConversationMessage:
    """One entry of the conversation the agent loop keeps and sends to the backend.

    ``calls`` are set on assistant messages that made tool calls; ``call_id`` is set on
    ``tool`` messages and names the call whose result ``text`` carries.
    """

    role: Literal["system", "user", "assistant", "tool"]
    text: str
    calls: tuple[ToolCallRequest, ...] = ()
    call_id: str | None = None


class ModelBackend(Protocol):
    """Decides each turn of an agent run."""

    def planned_steps(self) -> list[str] | None:
        """Return the step titles known before the run starts, or None to derive them."""
        ...

    async def next_turn(
        self, conversation: Sequence[ConversationMessage], tools: Sequence[Tool]
    ) -> ModelTurn:
        """Return the next turn.

        :raises ModelBackendError: when the model cannot produce one.
        """
        ...


class OfflineBackend:
    """Plays a template's offline plan, one step per turn, then finishes.

    The plan is fixed: tool errors do not change it, they only show in the stream. A call
    of a tool this host does not offer (no sandbox: no command, no screenshot) is left out.
    """

    def __init__(
        self, template: AgentTemplate, brief: str, project: Mapping[str, Any] | None = None
    ) -> None:
        self._steps: list[PlannedStep] = template.offline_plan(brief, project or {})
        self._next_step = 0

    def planned_steps(self) -> list[str]:
        return [step.title for step in self._steps]

    async def next_turn(
        self, conversation: Sequence[ConversationMessage], tools: Sequence[Tool]
    ) -> ModelTurn:
        if self._next_step >= len(self._steps):
            return ModelTurn(text="")
        step = self._steps[self._next_step]
        offered = {tool.name for tool in tools}
        calls = [
            ToolCallRequest(id=f"step{self._next_step + 1}-{index}", name=call.tool,
                            arguments=json.dumps(call.args))
            for index, call in enumerate(step.calls, start=1) if call.tool in offered
        ]
        self._next_step += 1
        return ModelTurn(text=step.say, calls=calls)


class OpenAIChatBackend:
    """An OpenAI-compatible ``/chat/completions`` endpoint with tools, streamed.

    ``base_url`` is the API root (for example ``https://host/v1``); ``timeout`` is how
    many seconds any one phase (connect, send, each read) may take. One HTTP client is
    opened per turn and closed before the turn returns; the TLS context they share is built
    once per backend, in a worker thread (loading the CA bundle costs about 30 ms of CPU,
    which would otherwise stall every other task of the service on each turn).
    """

    def __init__(self, base_url: str, model: str, api_key: str, timeout: float = 60.0) -> None:
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._model = model
        self._api_key = api_key
        self._timeout = timeout
        self._tls: ssl.SSLContext | None = None

    def planned_steps(self) -> None:
        return None

    async def next_turn(
        self, conversation: Sequence[ConversationMessage], tools: Sequence[Tool]
    ) -> ModelTurn:
        body: JsonObject = {
            "model": self._model,
            "stream": True,
            "messages": [_wire_message(message) for message in conversation],
        }
        if tools:
            body["tools"] = [_wire_tool(tool) for tool in tools]
        headers = {"Accept": "text/event-stream"}
        if self._api_key:
            headers["Authorization"] = f"Bearer {self._api_key}"
        if self._tls is None:
            self._tls = await trio.to_thread.run_sync(ssl.create_default_context)
        try:
            async with httpx.AsyncClient(timeout=self._timeout, verify=self._tls) as client, \
                    client.stream("POST", self._url, json=body, headers=headers) as response:
                if response.status_code >= 400:
                    detail = (await response.aread()).decode("utf-8", "replace")[:300]
                    raise ModelBackendError(self._redact(
                        f"model endpoint answered HTTP {response.status_code}: {detail}"))
                return await _read_stream(response)
        except httpx.TimeoutException as exc:
            raise ModelBackendError(
                f"model endpoint timed out (no progress for {self._timeout:g} seconds)") from exc
        except httpx.HTTPError as exc:
            raise ModelBackendError(self._redact(
                f"model endpoint failed: {type(exc).__name__}: {exc}")) from exc

    def _redact(self, message: str) -> str:
        return message.replace(self._api_key, "[redacted]") if self._api_key else message


def _wire_tool(tool: Tool) -> JsonObject:
    return {"type": "function", "function": {
        "name": tool.name, "description": tool.description, "parameters": tool.parameters}}


def _wire_message(message: ConversationMessage) -> JsonObject:
    if message.role == "tool":
        return {"role": "tool", "tool_call_id": message.call_id, "content": message.text}
    wire: JsonObject = {"role": message.role, "content": message.text}
    if message.calls:
        wire["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name, "arguments": call.arguments}}
            for call in message.calls
        ]
    return wire


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _TurnAssembler:
    """Builds a turn from the ``data:`` payloads of a stream: text and tool-call deltas."""

    def __init__(self) -> None:
        self.text: list[str] = []
        self.calls: dict[int, _PartialCall] = {}
        self.finished = False

    def feed(self, payload: str) -> None:
        """Take one payload; anything after the end of the reply is ignored.

        :raises ModelBackendError: when the payload is not a well-formed chunk.
        """
        if self.finished:
            return
        if payload == "[DONE]":
            self.finished = True
            return
        delta, finish_reason = _parse_chunk(payload)
        if isinstance(delta.get("content"), str):
            self.text.append(delta["content"])
        for call_delta in delta.get("tool_calls") or []:
            _merge_call_delta(self.calls, call_delta)
        self.finished = finish_reason is not None

    def turn(self) -> ModelTurn:
        """Return the assembled turn.

        :raises ModelBackendError: when the reply never finished or a call has no name.
        """
        if not self.finished:
            raise ModelBackendError("model stream ended before the reply was finished")
        calls = []
        for index in sorted(self.calls):
            partial = self.calls[index]
            if not partial.name:
                raise ModelBackendError(
                    f"model reply has a tool call (index {index}) without a name")
            calls.append(ToolCallRequest(id=partial.id or f"call-{index}", name=partial.name,
                                         arguments="".join(partial.arguments) or "{}"))
        return ModelTurn(text="".join(self.text), calls=calls)


async def _read_stream(response: httpx.Response) -> ModelTurn:
    """Read a streamed completion to its end and assemble the turn.

    :raises ModelBackendError: on a reply that is not an event stream, or a malformed
        or unfinished one.
    """
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        raise ModelBackendError("model endpoint did not answer with an event stream")
    assembler = _TurnAssembler()
    problem: ModelBackendError | None = None
    # The body is read to its end even after [DONE] or a bad chunk: leaving httpx's
    # nested stream generators half-consumed makes trio warn when they are collected.
    async for line in response.aiter_lines():
        if problem is None and line.startswith("data:"):
            try:
                assembler.feed(line[len("data:"):].strip())
            except ModelBackendError as exc:
                problem = exc
    if problem is not None:
        raise problem
    return assembler.turn()


def _parse_chunk(payload: str) -> tuple[JsonObject, str | None]:
    try:
        chunk = json.loads(payload)
        choices = chunk["choices"]
    except (ValueError, TypeError, KeyError) as exc:
        raise ModelBackendError(f"model stream has a malformed chunk: {payload[:200]!r}") from exc
    if not isinstance(choices, list):
        raise ModelBackendError("model stream chunk has no list of choices")
    if not choices:
        return {}, None  # usage-only chunks carry no choice
    choice = choices[0]
    delta = choice.get("delta") if isinstance(choice, dict) else None
    if not isinstance(delta, dict):
        raise ModelBackendError("model stream chunk has a choice without a delta")
    finish_reason = choice.get("finish_reason")
    return delta, finish_reason if isinstance(finish_reason, str) else None


def _merge_call_delta(partial_calls: dict[int, _PartialCall], call_delta: Any) -> None:
    if not isinstance(call_delta, dict) or not isinstance(call_delta.get("index"), int):
        raise ModelBackendError("model stream has a tool-call delta without an index")
    partial = partial_calls.setdefault(call_delta["index"], _PartialCall())
    if isinstance(call_delta.get("id"), str):
        partial.id = call_delta["id"]
    function = call_delta.get("function") or {}
    if not isinstance(function, dict):
        raise ModelBackendError("model stream has a tool-call delta with a malformed function")
    if isinstance(function.get("name"), str):
        partial.name += function["name"]
    if isinstance(function.get("arguments"), str):
        partial.arguments.append(function["arguments"])
