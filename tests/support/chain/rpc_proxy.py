"""A loopback HTTP JSON-RPC proxy in front of a node, misbehaving the way providers do.

``async with running_proxy(anvil.url) as proxy:`` serves on ``proxy.url`` inside the test's
Trio run and forwards JSON-RPC (single requests and batch arrays) to the node. A test switches
its behaviour at any time through these knobs:

- ``logs_range_limit`` (int or None): an ``eth_getLogs`` whose block range (``toBlock -
  fromBlock + 1``, tags resolved against the node's head) exceeds it gets a JSON-RPC error in
  the style ``logs_error_style`` instead of logs. Filters by ``blockHash`` always pass.
- ``logs_error_style``: a key of ``LOGS_ERRORS``. ``alchemy`` and ``infura`` suggest a
  range in the message (``[0x..., 0x...]``, the limit's worth from ``fromBlock``);
  ``quicknode`` names the limit; ``base`` and ``llamarpc`` give no hint.
- ``unsupported`` (set of methods): each is answered with geth's JSON-RPC error -32601 "the
  method ... does not exist/is not available", as free tiers refuse ``eth_getLogs``.
- ``http_status`` (int or None): every HTTP request is answered with this status without
  asking the node: 429 (with ``Retry-After: 1``), 502, ...
- ``logs_down_past`` (int or None): an HTTP request holding an ``eth_getLogs`` whose
  ``toBlock`` is past this block (and whose range ``logs_range_limit`` lets through) is
  answered 502: the provider down from the moment the indexer gets there, so that a test
  stops it mid-history without racing it.
- ``stall_seconds``: each HTTP request is held this long before it is handled (set it past
  the client's deadline for a stalled provider).
- ``head_lag``: ``eth_blockNumber`` and ``eth_getBlockByNumber("latest")`` answer as if the
  head were this many blocks lower (a node still syncing).
- ``await proxy.set_down(True)``: closes the listening socket and every open connection, so
  connecting is refused; ``set_down(False)`` listens again on the same port.

Counters: ``methods`` counts JSON-RPC methods received (each element of a batch), and
``http_requests`` the HTTP requests. When the node itself fails, the proxy answers 502.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from http import HTTPStatus
from typing import Any

import h11
import httpx
import trio

from plugins.chain.endpoint import open_client

JsonObject = dict[str, Any]

# eth_getLogs errors by provider: (JSON-RPC code, message template). The messages are the
# providers' public wording; {first}/{last} is the suggested range, {limit} the block limit.
LOGS_ERRORS: dict[str, tuple[int, str]] = {
    "alchemy": (-32602, "Log response size exceeded. You can make eth_getLogs requests with up "
                        "to a {limit} block range and no limit on the response size, or you "
                        "can request any block range with a cap of 10K logs in the response. "
                        "Based on your parameters, this block range should work: "
                        "[{first}, {last}]"),
    "infura": (-32005, "query returned more than 10000 results. Try with this block range "
                       "[{first}, {last}]."),
    "quicknode": (-32614, "eth_getLogs is limited to a {limit:,} range"),
    "base": (-32000, "block range too large"),
    "llamarpc": (-32000, "query exceeds max results 20000"),
}
_HEAD_TAGS = ("latest", "pending", "safe", "finalized")


class RpcProxy:
    """The proxy's state and knobs (see the module docstring); made by ``running_proxy``."""

    def __init__(self, upstream: str, client: httpx.AsyncClient, nursery: trio.Nursery) -> None:
        self.upstream = upstream
        self.logs_range_limit: int | None = None
        self.logs_error_style = "alchemy"
        self.unsupported: set[str] = set()
        self.http_status: int | None = None
        self.logs_down_past: int | None = None
        self.stall_seconds = 0.0
        self.head_lag = 0
        self.methods: Counter[str] = Counter()
        self.http_requests = 0
        self.port = 0
        self._client = client
        self._nursery = nursery
        self._serving: trio.CancelScope | None = None
        self._stopped = trio.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def set_down(self, down: bool) -> None:
        """Stop listening (connections refused) or listen again; returns once it is so."""
        if down and self._serving is not None:
            self._serving.cancel()
            await self._stopped.wait()
            self._serving = None
        elif not down and self._serving is None:
            await self._nursery.start(self._listen)

    async def _listen(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                      ) -> None:
        self._stopped = trio.Event()
        try:
            with trio.CancelScope() as self._serving:
                # Port 0 the first time; the same port again after a ``set_down``.
                listeners = await trio.open_tcp_listeners(self.port, host="127.0.0.1")
                self.port = listeners[0].socket.getsockname()[1]
                task_status.started()
                await trio.serve_listeners(self._handle, listeners)
        finally:
            self._stopped.set()

    async def _handle(self, stream: trio.SocketStream) -> None:
        """Serve one keep-alive connection until the client closes it."""
        connection = h11.Connection(h11.SERVER)
        async with stream:
            try:
                while (body := await _read_body(connection, stream)) is not None:
                    status, headers, payload = await self._respond(body)
                    headers = [("content-length", str(len(payload))), *headers]
                    for event in (h11.Response(status_code=status, headers=headers),
                                  h11.Data(data=payload), h11.EndOfMessage()):
                        await stream.send_all(connection.send(event) or b"")
                    connection.start_next_cycle()
            except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
                return

    async def _respond(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        self.http_requests += 1
        request = json.loads(body)
        items: list[JsonObject] = request if isinstance(request, list) else [request]
        self.methods.update(str(item.get("method")) for item in items)
        if self.stall_seconds:
            await trio.sleep(self.stall_seconds)
        if self.http_status is not None:
            return _plain(self.http_status)
        try:
            answers = [await self._answer(item) for item in items]
        except (httpx.HTTPError, _Down):
            return _plain(HTTPStatus.BAD_GATEWAY)
        reply = answers if isinstance(request, list) else answers[0]
        return 200, [("content-type", "application/json")], json.dumps(reply).encode()

    async def _answer(self, item: JsonObject) -> JsonObject:
        method, params = item.get("method"), item.get("params") or []
        if method in self.unsupported:
            return {"jsonrpc": "2.0", "id": item.get("id"), "error": {
                "code": -32601, "message": f"the method {method} does not exist/is not available"}}
        if method == "eth_getLogs" and self.logs_range_limit is not None:
            error = await self._logs_error(params[0], self.logs_range_limit)
            if error is not None:
                return {"jsonrpc": "2.0", "id": item.get("id"), "error": error}
        if method == "eth_getLogs" and self.logs_down_past is not None \
                and "blockHash" not in params[0] \
                and await self._number(params[0].get("toBlock", "latest")) > self.logs_down_past:
            raise _Down
        if self.head_lag and method == "eth_blockNumber":
            return {"jsonrpc": "2.0", "id": item.get("id"), "result": hex(await self._lagged())}
        if self.head_lag and method == "eth_getBlockByNumber" and params[0] == "latest":
            item = {**item, "params": [hex(await self._lagged()), *params[1:]]}
        return await self._forward(item)

    async def _logs_error(self, query: JsonObject, limit: int) -> JsonObject | None:
        if "blockHash" in query:
            return None
        first = await self._number(query.get("fromBlock", "latest"))
        last = await self._number(query.get("toBlock", "latest"))
        if last - first + 1 <= limit:
            return None
        code, template = LOGS_ERRORS[self.logs_error_style]
        message = template.format(limit=limit, first=hex(first), last=hex(first + limit - 1))
        return {"code": code, "message": message}

    async def _number(self, block: str) -> int:
        if block == "earliest":
            return 0
        return await self._head() if block in _HEAD_TAGS else int(block, 16)

    async def _lagged(self) -> int:
        return max(await self._head() - self.head_lag, 0)

    async def _head(self) -> int:
        reply = await self._forward({"jsonrpc": "2.0", "id": 0, "method": "eth_blockNumber",
                                     "params": []})
        return int(reply["result"], 16)

    async def _forward(self, item: JsonObject) -> JsonObject:
        response = await self._client.post(self.upstream, json=item)
        response.raise_for_status()
        answer: JsonObject = response.json()
        return answer


class _Down(Exception):
    """The provider is down for this request (``logs_down_past``): answered 502."""


def _plain(status: int) -> tuple[int, list[tuple[str, str]], bytes]:
    """An HTTP error answer with the status's reason as its text body."""
    headers = [("content-type", "text/plain")]
    if status == HTTPStatus.TOO_MANY_REQUESTS:
        headers.append(("retry-after", "1"))
    return status, headers, HTTPStatus(status).phrase.encode()


async def _read_body(connection: h11.Connection, stream: trio.SocketStream) -> bytes | None:
    """The body of the next request on the connection; None once the client closed it."""
    body = bytearray()
    while True:
        event = connection.next_event()
        if event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, h11.EndOfMessage):
            return bytes(body)
        elif isinstance(event, h11.ConnectionClosed):
            return None


@asynccontextmanager
async def running_proxy(upstream: str) -> AsyncIterator[RpcProxy]:
    """A proxy to ``upstream`` on 127.0.0.1 (a free port), serving until the block ends."""
    # The service's own node client: it writes a body in memory in one piece, so a
    # forward cancelled mid-send (a caller gone, a proxy set down) leaves no async
    # generator to warn when it is collected, in whichever later test that happens.
    async with open_client() as client, trio.open_nursery() as nursery:
        client.timeout = httpx.Timeout(30)
        proxy = RpcProxy(upstream, client, nursery)
        await proxy.set_down(False)
        try:
            yield proxy
        finally:
            nursery.cancel_scope.cancel()
