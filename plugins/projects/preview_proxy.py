"""The preview of a server a run started (``start_preview``): proxied over its Unix socket.

The server runs in a network-less command sandbox (``Sandbox.serve``); its one way out is the
bridge's Unix socket, which socat forwards inside to the server's loopback port. A preview
request for that project's work tree goes there (httpx's UDS transport) instead of to the
files: only ``GET``/``HEAD``, the path and query, and an ``Accept`` header go in (never a
cookie or a credential); the status, the body (streamed, at most ``MAX_BODY_BYTES``, each
read within ``READ_SECONDS`` and the whole answer within ``ANSWER_SECONDS``) and a few
content headers come back, with the preview's security headers set over them.

The socket exists only in the process that runs the run: elsewhere, and once the run has
ended, the preview serves the files.
"""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator

import httpx
import trio
from quart import Response

from runtime.errors import PayloadTooLarge, Unavailable
from runtime.sandbox import LiveServer

MAX_BODY_BYTES = 20 * 1024 * 1024
READ_SECONDS = 10.0
ANSWER_SECONDS = 30.0
_PASSED_BACK = ("content-type", "content-length", "etag", "last-modified", "content-language")
_PASSED_IN = ("accept", "accept-language", "if-none-match", "if-modified-since")
# Plain HTTP over a Unix socket needs no TLS, but httpx builds a context for every transport
# unless given one: with the CA bundle loaded, that was 40 ms of CPU per preview request.
_UNUSED_TLS = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


class ServerGone(Exception):
    """The socket did not accept the connection: the server stopped; serve the files."""


async def from_server(live: LiveServer, method: str, target: str, headers: dict[str, str],
                      prefix: str) -> Response:
    """The server's answer to ``method target`` (``target``: path and query from ``/``).

    ``prefix`` is where the preview's root is on this host: a redirect the server sends to
    an absolute path is kept under it.

    :raises ServerGone: nothing listens on the socket any more.
    :raises Unavailable: the server did not answer in time, or broke off.
    :raises PayloadTooLarge: the answer says it is over ``MAX_BODY_BYTES``.
    """
    client = httpx.AsyncClient(
        transport=httpx.AsyncHTTPTransport(uds=str(live.socket), verify=_UNUSED_TLS),
        base_url=f"http://127.0.0.1:{live.server.port}",
        timeout=httpx.Timeout(READ_SECONDS), follow_redirects=False, trust_env=False)
    sent_in = {name: value for name, value in headers.items() if name.lower() in _PASSED_IN}
    try:
        answer = await client.send(client.build_request(method, target, headers=sent_in),
                                   stream=True)
    except httpx.ConnectError as exc:
        await client.aclose()
        raise ServerGone(str(exc)) from None
    except httpx.HTTPError as exc:
        await client.aclose()
        raise Unavailable(f"the preview server did not answer: {type(exc).__name__}") from None
    length = answer.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_BODY_BYTES:
        await answer.aclose()
        await client.aclose()
        raise PayloadTooLarge(f"the preview server's answer is over {MAX_BODY_BYTES} bytes")
    passed = {name: answer.headers[name] for name in _PASSED_BACK if name in answer.headers}
    location = answer.headers.get("location")
    if location is not None:
        passed["Location"] = prefix + location[1:] if location.startswith("/") \
            and not location.startswith("//") else location
    return Response(_body(answer, client), status=answer.status_code, headers=passed)


async def _body(answer: httpx.Response, client: httpx.AsyncClient) -> AsyncIterator[bytes]:
    """The answer's bytes as they come, cut at the size cap or the answer deadline (the
    client then sees a short body, the status having been sent)."""
    deadline = trio.current_time() + ANSWER_SECONDS
    sent = 0
    try:
        # Cut by closing the answer, not by leaving the loop: the next read then fails
        # inside httpcore, whose own body generator ends instead of waiting for the GC.
        async for chunk in answer.aiter_raw():
            sent += len(chunk)
            if answer.is_closed:
                continue
            if sent > MAX_BODY_BYTES or trio.current_time() > deadline:
                await answer.aclose()
                continue
            yield chunk
    except (httpx.HTTPError, httpx.StreamError):
        pass  # the server broke off, or the cut: the body ends short
    finally:
        await answer.aclose()
        await client.aclose()
