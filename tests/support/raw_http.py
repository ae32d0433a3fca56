"""HTTP/1.1 spoken by hand over a raw socket, for tests of framing, early answers and
connection handling that an HTTP client library would hide."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

import pytest
import trio

from runtime.server import Running

DEADLINE = 20  # seconds for one answer, or for the close; generous for a loaded machine


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error_code(self) -> str:
        code: str = json.loads(self.body)["error"]["code"]
        return code


class RawConnection:
    """One HTTP/1.1 connection spoken by hand; every read fails after ``DEADLINE``."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self.stream = stream
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def answer(self) -> Answer:
        """The next response (with a Content-Length body); fails if it does not come."""
        with trio.move_on_after(DEADLINE):
            while True:
                head, separator, rest = self.buffer.partition(b"\r\n\r\n")
                length = re.search(rb"(?im)^content-length: *(\d+)", head)
                if separator and length and len(rest) >= int(length.group(1)):
                    self.buffer = rest[int(length.group(1)):]
                    return parse(head, rest[:int(length.group(1))])
                chunk = await self.stream.receive_some(65536)
                if not chunk:
                    pytest.fail(f"the server closed the connection instead of answering; "
                                f"received {self.buffer!r}")
                self.buffer += chunk
        pytest.fail(f"no answer within {DEADLINE} s: the connection hangs; "
                    f"received {self.buffer!r}")

    async def closed_by_server(self) -> bool:
        """Whether the server closes the connection (end of stream or reset) in time."""
        with trio.move_on_after(DEADLINE):
            try:
                while chunk := await self.stream.receive_some(65536):
                    self.buffer += chunk
            except trio.BrokenResourceError:
                pass  # a reset: the server closed with our unread bytes in its buffer
            return True
        return False


def parse(head: bytes, body: bytes) -> Answer:
    """A response from its head and body."""
    status_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


async def connect(running: Running) -> trio.SocketStream:
    """A new connection to the running service."""
    host, port = running.base_url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))
