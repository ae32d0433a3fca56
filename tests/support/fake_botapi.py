"""A fake messaging-platform Bot API (Telegram's ``sendMessage``) on a loopback port.

It records every message and can fail the first ``fail_first`` requests with a given
status, to check that the notifier retries.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import trio


@dataclass
class SentMessage:
    path: str
    chat_id: int
    text: str


@dataclass
class FakeBotApi:
    fail_first: int = 0
    fail_status: int = 500
    messages: list[SentMessage] = field(default_factory=list)
    attempts: int = 0
    _arrived: trio.Event = field(default_factory=trio.Event)

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        """Listen on 127.0.0.1 and report the base URL (``http://127.0.0.1:PORT``)."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        task_status.started(f"http://127.0.0.1:{port}")
        await trio.serve_listeners(self._handle, listeners)

    async def wait_for(self, count: int, timeout: float = 10.0) -> list[SentMessage]:
        with trio.fail_after(timeout):
            while len(self.messages) < count:
                await self._arrived.wait()
                self._arrived = trio.Event()
        return self.messages

    async def _handle(self, stream: trio.SocketStream) -> None:
        async with stream:
            data = b""
            while b"\r\n\r\n" not in data:
                chunk = await stream.receive_some()
                if not chunk:
                    return
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                           if line.lower().startswith("content-length:")), 0)
            while len(body) < length:
                body += await stream.receive_some()
            self.attempts += 1
            if self.attempts <= self.fail_first:
                reply = {"ok": False, "error_code": self.fail_status, "description": "fake",
                         "parameters": {"retry_after": 0.05}}
                await _send(stream, self.fail_status, reply)
                return
            message = json.loads(body)
            self.messages.append(SentMessage(lines[0].split(" ")[1], int(message["chat_id"]),
                                             message["text"]))
            self._arrived.set()
            await _send(stream, 200, {"ok": True, "result": {"message_id": len(self.messages)}})


async def _send(stream: trio.SocketStream, status: int, body: dict[str, object]) -> None:
    payload = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} Fake\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n")
    await stream.send_all(head.encode() + payload)
