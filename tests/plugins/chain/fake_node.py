"""A fake JSON-RPC node on a real loopback port (a tiny ASGI app served by hypercorn in the
test's nursery), for the RPC pool's tests.

It answers ``eth_chainId``, ``eth_blockNumber`` and ``eth_getLogs`` (one synthetic log per
block) from its settings, any method from ``errors`` with that JSON-RPC error, and everything
else with ``method not found``; batch arrays are answered item by item, reversed when
``reverse_batches`` is set. ``script`` overrides whole HTTP answers, one per request, in order
(a 429, a 500, a stall). Every request body is recorded.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import httpx
import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from hypercorn.typing import ASGIReceiveCallable as Receive
from hypercorn.typing import ASGISendCallable as Send

from plugins.chain.rpc import RpcPool

Json = Any
Range = Callable[[int, int], Any]


@dataclass(frozen=True)
class Answer:
    """A scripted HTTP answer: a status, headers and a JSON body (None: the normal answer),
    after ``delay`` seconds."""

    status: int = 200
    body: Json = None
    headers: dict[str, str] = field(default_factory=dict)
    delay: float = 0.0


@dataclass
class FakeNode:
    chain_id: int = 56
    head: int = 1_000_000
    errors: dict[str, dict[str, Any]] = field(default_factory=dict)
    # eth_getLogs from..to answers the JSON-RPC error range_error(from, to) when
    # refuses(from, to) is true.
    refuses: Range | None = None
    range_error: Range | None = None
    reverse_batches: bool = False
    script: list[Answer] = field(default_factory=list)
    requests: list[Json] = field(default_factory=list)
    port: int = 0

    def url(self, path: str = "/rpc") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def methods(self) -> list[str]:
        """The methods asked so far, batch items included, in order."""
        calls = [item for body in self.requests
                 for item in (body if isinstance(body, list) else [body])]
        return [call["method"] for call in calls]

    def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        """The JSON-RPC answer object to one request object."""
        method, params = request["method"], request.get("params", [])
        reply: dict[str, Any] = {"jsonrpc": "2.0", "id": request["id"]}
        if method in self.errors:
            return {**reply, "error": self.errors[method]}
        if method == "eth_chainId":
            return {**reply, "result": hex(self.chain_id)}
        if method == "eth_blockNumber":
            return {**reply, "result": hex(self.head)}
        if method == "eth_getLogs":
            start, end = int(params[0]["fromBlock"], 16), int(params[0]["toBlock"], 16)
            if self.refuses is not None and self.refuses(start, end):
                assert self.range_error is not None
                return {**reply, "error": self.range_error(start, end)}
            return {**reply, "result": [synthetic_log(block) for block in range(start, end + 1)]}
        return {**reply, "error": {"code": -32601, "message": f"the method {method} does not "
                                                              "exist/is not available"}}

    async def app(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        """The ASGI application: JSON-RPC over HTTP POST, whatever the path."""
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        body = b""
        more = True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        request = json.loads(body)
        self.requests.append(request)
        scripted = self.script.pop(0) if self.script else Answer()
        if scripted.delay:
            await trio.sleep(scripted.delay)
        reply = scripted.body if scripted.body is not None else self._reply(request)
        headers = [(b"content-type", b"application/json"),
                   *((name.encode(), value.encode()) for name, value in scripted.headers.items())]
        await send({"type": "http.response.start", "status": scripted.status,
                    "headers": headers})
        await send({"type": "http.response.body", "body": json.dumps(reply).encode()})

    def _reply(self, request: Json) -> Json:
        if not isinstance(request, list):
            return self.answer(request)
        replies = [self.answer(item) for item in request]
        return replies[::-1] if self.reverse_batches else replies


def wider_than(limit: int) -> Range:
    """A ``refuses`` for a provider that allows at most ``limit`` blocks."""
    return lambda start, end: end - start + 1 > limit


def synthetic_log(block: int) -> dict[str, Any]:
    """The one log the fake node has in ``block``."""
    return {"blockNumber": hex(block), "logIndex": "0x0", "topics": [], "data": "0x"}


@asynccontextmanager
async def serving(*nodes: FakeNode) -> AsyncIterator[None]:
    """Serve every node on its own loopback port until the block ends."""
    async with trio.open_nursery() as nursery:
        for node in nodes:
            config = Config()
            config.bind = ["127.0.0.1:0"]
            config.accesslog = None
            # Tests jump a mock clock by minutes: idle connections must outlive such jumps.
            config.keep_alive_timeout = 3600
            binds = await nursery.start(partial(serve, node.app, config,
                                                shutdown_trigger=trio.sleep_forever))
            node.port = int(binds[0].rpartition(":")[2])
        try:
            yield
        finally:
            nursery.cancel_scope.cancel()


def make_pool(client: httpx.AsyncClient, *nodes: FakeNode, **options: Any) -> RpcPool:
    """A pool of ``nodes`` (in that order) with a seeded jitter."""
    options.setdefault("rng", random.Random(7))
    return RpcPool([node.url() for node in nodes], client, chain="test", **options)


def soon(seconds: float = 30.0) -> float:
    """A deadline ``seconds`` from now on Trio's clock."""
    return trio.current_time() + seconds
