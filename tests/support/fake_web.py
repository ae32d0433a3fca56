"""A real web site on a loopback port, for the ``fetch_url`` tests and bench.

Each connection gets one answer, then is closed (HTTP/1.1 with ``Connection: close``). The
answers are fixed by path:

- ``/page.html``: an HTML page with a title, a script, a style and two paragraphs;
- ``/notes.txt``: plain text in ISO-8859-1 (its charset declared);
- ``/big``: ``size`` bytes of text (query ``?size=N``);
- ``/stall``: headers, a little of the body, then nothing for an hour;
- ``/image.png``: a few bytes as ``image/png``;
- ``/gzip``: a gzip-encoded body whatever the request asked;
- ``/redirect?to=URL``: 302 to ``URL``;
- ``/hops/N``: 302 to ``/hops/N-1`` until ``/hops/0``, which is ``page.html``.
"""

from __future__ import annotations

import gzip
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from urllib.parse import parse_qs, urlsplit

import trio

PAGE = ("<!doctype html><html><head><title>Moon facts</title><style>p{color:red}</style>"
        "<script>var secret = 'not text';</script></head><body><h1>The Moon</h1>"
        "<p>It orbits the Earth.</p><p>It has no air &amp; no water.</p></body></html>")


def _answer(status: str, content_type: str, body: bytes, *extra: str) -> bytes:
    head = [f"HTTP/1.1 {status}", f"Content-Type: {content_type}",
            f"Content-Length: {len(body)}", "Connection: close", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class FakeWeb:
    """Serves the fixed site; ``paths`` records every request target, in order."""

    def __init__(self) -> None:
        self.port = 0
        self.paths: list[str] = []

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    async def handle(self, stream: trio.SocketStream) -> None:
        try:
            head = b""
            while b"\r\n\r\n" not in head and len(head) < 65536:
                chunk = await stream.receive_some(65536)
                if not chunk:
                    return
                head += chunk
            target = head.split(b" ", 2)[1].decode()
            self.paths.append(target)
            await self._respond(stream, target)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            return
        finally:
            await stream.aclose()

    async def _respond(self, stream: trio.SocketStream, target: str) -> None:
        parts = urlsplit(target)
        query = parse_qs(parts.query)
        path = parts.path
        if path in ("/page.html", "/hops/0"):
            reply = _answer("200 OK", "text/html; charset=utf-8", PAGE.encode())
        elif path == "/notes.txt":
            reply = _answer("200 OK", "text/plain; charset=iso-8859-1", "Café crème".encode(
                "iso-8859-1"))
        elif path == "/big":
            reply = _answer("200 OK", "text/plain", b"x" * int(query["size"][0]))
        elif path == "/stall":
            await stream.send_all(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n"
                                  b"Content-Length: 100000\r\n\r\nstarted")
            await trio.sleep(3600)
            return
        elif path == "/image.png":
            reply = _answer("200 OK", "image/png", b"\x89PNG\r\n\x1a\n\0\0\0")
        elif path == "/gzip":
            reply = _answer("200 OK", "text/plain", gzip.compress(b"z" * 100000),
                            "Content-Encoding: gzip")
        elif path == "/redirect":
            reply = _answer("302 Found", "text/plain", b"", f"Location: {query['to'][0]}")
        elif path.startswith("/hops/"):
            reply = _answer("302 Found", "text/plain", b"",
                            f"Location: /hops/{int(path.rsplit('/', 1)[1]) - 1}")
        else:
            reply = _answer("404 Not Found", "text/plain", b"no such page")
        await stream.send_all(reply)


@asynccontextmanager
async def running_web() -> AsyncIterator[FakeWeb]:
    """The site, listening on 127.0.0.1 (a free port) until the block ends."""
    web = FakeWeb()
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, web.handle, 0, host="127.0.0.1"))
        web.port = listeners[0].socket.getsockname()[1]
        try:
            yield web
        finally:
            nursery.cancel_scope.cancel()
