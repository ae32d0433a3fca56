"""A fake OpenAI-compatible ``/chat/completions`` server on a real loopback port.

It answers each request with the next reply of a script: a streamed turn (text and
tool calls cut into deltas the way real servers send them), an HTTP error, a stall, or
raw stream lines. Every request is recorded so tests can check what the model was sent.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import trio
import trio.lowlevel

JsonObject = dict[str, Any]


@dataclass(frozen=True)
class StreamedTurn:
    """A turn streamed as deltas: ``calls`` are (tool name, arguments JSON text) pairs."""

    text: str = ""
    calls: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class HttpFailure:
    """An HTTP error status; ``echo_authorization`` puts the request's header in the body."""

    status: int
    body: str = "internal error"
    echo_authorization: bool = False


@dataclass(frozen=True)
class Stall:
    """Send the response headers, then nothing for ``seconds``."""

    seconds: float


@dataclass(frozen=True)
class RawReply:
    """Send these body lines as they are, with the given content type."""

    lines: list[str]
    content_type: str = "text/event-stream"


@dataclass(frozen=True)
class Gated:
    """Wait until ``gate`` is set (the test has looked at the run mid-way), then ``turn``."""

    gate: trio.Event
    turn: StreamedTurn


Reply = StreamedTurn | HttpFailure | Stall | RawReply | Gated


@dataclass
class RecordedRequest:
    path: str
    headers: dict[str, str]
    body: JsonObject


def _halves(text: str) -> list[str]:
    middle = len(text) // 2
    return [part for part in (text[:middle], text[middle:]) if part]


def stream_chunks(turn: StreamedTurn) -> list[str]:
    """Return the ``data:`` payloads of a streamed turn, ending with ``[DONE]``."""
    deltas: list[JsonObject] = [{"role": "assistant", "content": ""}]
    deltas += [{"content": piece} for piece in _halves(turn.text)]
    for index, (name, arguments) in enumerate(turn.calls):
        deltas.append({"tool_calls": [{"index": index, "id": f"fake-{index}", "type": "function",
                                       "function": {"name": name, "arguments": ""}}]})
        deltas += [{"tool_calls": [{"index": index, "function": {"arguments": piece}}]}
                   for piece in _halves(arguments)]
    chunks = [{"id": "fake", "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
              for delta in deltas]
    finish = "tool_calls" if turn.calls else "stop"
    chunks.append({"id": "fake", "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return [json.dumps(chunk) for chunk in chunks] + ["[DONE]"]


class FakeOpenAI:
    """Serves ``script`` one reply per request; past its end it answers HTTP 500."""

    def __init__(self, script: list[Reply]) -> None:
        self.script = list(script)
        self.requests: list[RecordedRequest] = []

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        """Listen on 127.0.0.1 and report the base URL (``http://127.0.0.1:PORT/v1``)."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"http://127.0.0.1:{port}/v1")
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            request = await _read_request(stream)
            if request is None:
                return
            self.requests.append(request)
            reply: Reply = (self.script.pop(0) if self.script
                            else HttpFailure(500, "fake script exhausted"))
            await self._answer(stream, request, reply)

    async def _answer(self, stream: trio.SocketStream, request: RecordedRequest,
                      reply: Reply) -> None:
        if isinstance(reply, HttpFailure):
            body = reply.body
            if reply.echo_authorization:
                body += " " + request.headers.get("authorization", "")
            await _send_head(stream, reply.status, "text/plain", len(body.encode()))
            await stream.send_all(body.encode())
            return
        if isinstance(reply, RawReply):
            await _send_head(stream, 200, reply.content_type)
            for line in reply.lines:
                await stream.send_all(f"{line}\n".encode())
            return
        if isinstance(reply, Gated):
            await reply.gate.wait()
            reply = reply.turn
        await _send_head(stream, 200, "text/event-stream")
        if isinstance(reply, Stall):
            await trio.sleep(reply.seconds)
            return
        for payload in stream_chunks(reply):
            await stream.send_all(f"data: {payload}\n\n".encode())
            await trio.lowlevel.checkpoint()


async def _send_head(stream: trio.SocketStream, status: int, content_type: str,
                     length: int | None = None) -> None:
    # Without a length the body runs until the connection closes, as a stream does.
    head = [f"HTTP/1.1 {status} Fake", f"Content-Type: {content_type}", "Connection: close"]
    if length is not None:
        head.append(f"Content-Length: {length}")
    await stream.send_all(("\r\n".join(head) + "\r\n\r\n").encode())


async def _read_request(stream: trio.SocketStream) -> RecordedRequest | None:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = await stream.receive_some()
        if not chunk:
            return None
        body += chunk
    return RecordedRequest(path=request_line.split(" ")[1], headers=headers,
                           body=json.loads(body) if body else {})
