"""A small async JSON-RPC client over httpx, for tests (httpx runs on Trio and honours
cancellation, which web3's async provider does not)."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from types import TracebackType
from typing import Any

import httpx

from tests.support.server import tls_context


class RpcError(Exception):
    """A JSON-RPC error object: ``code``, ``message`` and optional ``data``."""

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.data = data


class Rpc:
    """JSON-RPC 2.0 over HTTP to ``url``: ``async with Rpc(url) as rpc: await rpc.call(...)``.

    HTTP errors (a 429, a 502, a refused connection, a timeout) raise httpx's exceptions as
    they are, so tests see exactly what a provider did.
    """

    def __init__(self, url: str, *, timeout: float = 30.0) -> None:
        self.url = url
        self.http = httpx.AsyncClient(timeout=timeout, verify=tls_context())
        self._ids = itertools.count(1)

    async def __aenter__(self) -> Rpc:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        traceback: TracebackType | None) -> None:
        await self.http.aclose()

    async def call(self, method: str, *params: Any) -> Any:
        """The result of one call.

        :raises RpcError: the node answered with an error object.
        """
        reply = await self._post(self._request(method, params))
        return _result(reply)

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]]) -> list[Any]:
        """One HTTP request with every call; each result in order, or its ``RpcError`` (not
        raised, so one failed call does not hide the others' results)."""
        requests = [self._request(method, params) for method, params in calls]
        replies = await self._post(requests)
        by_id = {reply["id"]: reply for reply in replies}
        results: list[Any] = []
        for request in requests:
            try:
                results.append(_result(by_id[request["id"]]))
            except RpcError as error:
                results.append(error)
        return results

    def _request(self, method: str, params: Sequence[Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": next(self._ids), "method": method,
                "params": list(params)}

    async def _post(self, body: Any) -> Any:
        response = await self.http.post(self.url, json=body)
        response.raise_for_status()
        return response.json()


def _result(reply: dict[str, Any]) -> Any:
    if "error" in reply:
        error = reply["error"]
        raise RpcError(error["code"], error["message"], error.get("data"))
    return reply["result"]
