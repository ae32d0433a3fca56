"""One RPC URL: JSON-RPC over ``httpx.AsyncClient`` on Trio, its answers classified, its health
kept and every request reported to the observer.

web3.py's async provider does not run under Trio and its sync provider in a thread cannot be
cancelled, so requests go through httpx, each under a Trio deadline: an absolute time on Trio's
clock (``trio.current_time() + seconds``), as in ``trio.move_on_at``.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any, TypeVar

import httpx
import trio

from plugins.chain.health import CooldownPolicy, EndpointHealth
from plugins.chain.rpc_errors import (
    ChainIdMismatch,
    LogRangeTooLarge,
    MethodUnsupported,
    RpcDeterministicError,
    RpcError,
    RpcTransientError,
    classify_error,
)
from plugins.chain.rpc_metrics import RpcObserver
from runtime.http1 import Http1Transport

T = TypeVar("T")

log = logging.getLogger("flowsvc.chain.rpc")
# Requests under way at once to one chain's URLs (as many connections more may wait idle).
MAX_CONNECTIONS = 64
# HTTP statuses of a URL refusing a method (forbidden on this plan, not allowed at all).
_REFUSED = frozenset({403, 405})


def open_client() -> httpx.AsyncClient:
    """A client for one chain's RPC URLs, on a connection pool of its own: ``runtime.http1``,
    whose cost per request does not grow with the pool (httpx's own pool polls every pooled
    connection on each request) and which sends a request in one write."""
    return httpx.AsyncClient(transport=Http1Transport(max_connections=MAX_CONNECTIONS))


@dataclass(frozen=True)
class BatchAnswer:
    """One answer of a batch: its ``result``, or the ``error`` the node gave for it (a
    deterministic or range error; a transient one fails the whole batch over instead)."""

    result: Any = None
    error: RpcError | None = None

    def unwrap(self) -> Any:
        """Return the result. Raises the item's error if it has one."""
        if self.error is not None:
            raise self.error
        return self.result


class RpcEndpoint:
    """One RPC URL: sends requests, classifies answers, keeps the URL's health and reports
    each request to the observer. The httpx client belongs to the caller of the pool."""

    def __init__(self, url: str, label: str, client: httpx.AsyncClient, *, ids: Iterator[int],
                 cooldown: CooldownPolicy, observer: RpcObserver, rng: random.Random) -> None:
        self.url = url
        self.label = label
        self.health = EndpointHealth()
        self.chain_id: int | None = None
        # The highest head this URL reported: a URL must have a block before it is asked
        # about it (a node behind answers eth_getLogs with nothing, not with an error).
        self.head_seen: int | None = None
        self._client = client
        self._ids = ids
        self._cooldown = cooldown
        self._observer = observer
        self._rng = rng

    async def call(self, method: str, params: Sequence[Any], *, deadline: float) -> Any:
        """Send one request and return its result.

        :raises MethodUnsupported: this URL does not serve ``method`` (now or lately).
        :raises RpcDeterministicError: the request itself is wrong (revert, bad params...).
        :raises LogRangeTooLarge: an ``eth_getLogs`` range the provider refuses.
        :raises RpcTransientError: this URL failed; it is now cooling down.
        """
        return await self.call_checked(method, params, lambda result: result, deadline=deadline)

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]], *,
                    deadline: float) -> list[BatchAnswer]:
        """Send ``calls`` as one JSON-RPC batch and return their answers in the order of
        ``calls`` (answers are matched by id; nodes may reorder them).

        :raises RpcTransientError: this URL failed, or any item failed transiently.
        :raises MethodUnsupported: the URL does not serve batches or one of the methods (the
            pool sends the whole batch to another URL).
        :raises RpcDeterministicError: the node refused the batch as a whole.
        """
        ids = [next(self._ids) for _ in calls]
        methods = dict(zip(ids, (method for method, _ in calls), strict=True))

        async def exchange() -> list[BatchAnswer]:
            payload = [_request(request_id, method, params)
                       for request_id, (method, params) in zip(ids, calls, strict=True)]
            body = await self._post(payload, deadline, "batch")
            if isinstance(body, dict):
                raise self._classified("batch", body.get("error"))
            if not isinstance(body, list):
                raise _bad_response("a batch answered with neither an array nor an error")
            by_id = {item.get("id"): item for item in body if isinstance(item, dict)}
            if not all(request_id in by_id for request_id in ids):
                raise _bad_response("a batch answer lacks some of the request ids")
            return [self._item(by_id[request_id], methods[request_id]) for request_id in ids]

        return await self._observed("batch", exchange, ("batch", *methods.values()))

    async def head(self, *, min_final: int | None, deadline: float) -> int:
        """Return the latest block number. A head below ``min_final`` (a block the caller
        already holds as final) means a node still syncing, not a reorg.

        :raises RpcTransientError: the URL failed or lags (outcome ``lagging``); it now cools.
        """
        def checked(result: Any) -> int:
            number = _quantity(result)
            if min_final is not None and number < min_final:
                raise RpcTransientError(f"head {number} is behind final block {min_final}",
                                        outcome="lagging")
            return number

        number = await self.call_checked("eth_blockNumber", [], checked, deadline=deadline)
        self.head_seen = max(number, self.head_seen or 0)
        return number

    async def verify_chain_id(self, expected: int, *, deadline: float) -> None:
        """Ask the node for its chain id; a URL serving another chain is disabled for good.

        :raises ChainIdMismatch: it serves another chain.
        :raises RpcError: it could not say (``RpcTransientError`` cools it down).
        """
        actual = await self.call_checked("eth_chainId", [], _quantity, deadline=deadline)
        self.chain_id = actual
        if actual != expected:
            self.health.cooling_until = math.inf
            log.error("RPC URL %s serves chain id %d, expected %d: not used", self.label,
                      actual, expected)
            raise ChainIdMismatch(expected, [(self.label, actual)])

    async def call_checked(self, method: str, params: Sequence[Any],
                           checked: Callable[[Any], T], *, deadline: float) -> T:
        """Send one request and return ``checked(result)``; ``checked`` converts the result or
        rejects it with ``RpcTransientError``, which counts against this URL like any other
        failure. Raises as ``call``."""
        request_id = next(self._ids)

        async def exchange() -> T:
            body = await self._post(_request(request_id, method, params), deadline, method)
            return checked(self._single(body, request_id, method))

        return await self._observed(method, exchange, (method,))

    async def _observed(self, method: str, exchange: Callable[[], Awaitable[T]],
                        needs: Sequence[str]) -> T:
        """Run one HTTP exchange, then record its outcome in the health and the observer.

        :param needs: the methods the exchange uses: one this URL does not serve raises
            ``MethodUnsupported`` without a request.
        """
        started = trio.current_time()
        self._refuse_unsupported(needs, started)
        try:
            result = await exchange()
        except MethodUnsupported as error:
            self._mark_unsupported(error, started)
            raise
        except RpcTransientError as error:
            now = trio.current_time()
            cooldown = self.health.failed(now, self._cooldown, self._rng, error.retry_after)
            log.info("RPC URL %s cools down for %.1f s: %s", self.label, cooldown, error)
            self._observer.observe(self.label, method, error.outcome, now - started)
            raise
        except (RpcDeterministicError, LogRangeTooLarge) as error:
            # The node answered properly; the request was the problem.
            self._settle(method, started, _outcome(error))
            raise
        self._settle(method, started, "ok")
        return result

    def _refuse_unsupported(self, needs: Sequence[str], now: float) -> None:
        for method in self.health.expired_unsupported(now):
            log.info("RPC URL %s is asked for %s again", self.label, method)
            self._observer.unsupported(self.label, method, False)
        for method in needs:
            if not self.health.supports(method, now):
                raise MethodUnsupported(f"{method}: not served by {self.label}", method=method)

    def _mark_unsupported(self, error: MethodUnsupported, started: float) -> None:
        """The URL answered properly that it does not serve a method: that is a missing
        capability of this URL, not a failure of it (no cooldown), logged once per mark."""
        now = trio.current_time()
        self.health.succeeded(now - started)
        self._observer.observe(self.label, error.method, "unsupported", now - started)
        if self.health.mark_unsupported(error.method, now, self._cooldown):
            log.warning("RPC URL %s does not serve %s (%s): the other URLs are asked for it "
                        "for %g s", self.label, error.method, error,
                        self._cooldown.unsupported_seconds)
            self._observer.unsupported(self.label, error.method, True)

    def _settle(self, method: str, started: float, outcome: str) -> None:
        seconds = trio.current_time() - started
        self.health.succeeded(seconds)
        self._observer.observe(self.label, method, outcome, seconds)

    async def _post(self, payload: Any, deadline: float, method: str) -> Any:
        """POST ``payload`` (``method``, or ``batch``); return the parsed JSON body of a usable
        answer.

        :raises RpcTransientError: timeout, transport error, 429, 5xx or a body not JSON.
        :raises MethodUnsupported: HTTP 403 or 405 without a JSON-RPC error: the URL refuses
            ``method``.
        """
        with trio.move_on_at(deadline):
            try:
                response = await self._client.post(self.url, json=payload)
            except httpx.HTTPError as error:
                # httpx messages may quote the URL, and with it a key: name the label instead.
                text = str(error).replace(self.url, self.label)
                raise RpcTransientError(f"{type(error).__name__}: {text}",
                                        outcome="transport") from None
            return _body(response, method)
        raise RpcTransientError("no answer before the deadline", outcome="timeout")

    def _single(self, body: Any, request_id: int, method: str) -> Any:
        if not isinstance(body, dict):
            raise _bad_response("the answer is not a JSON object")
        if body.get("error") is not None:
            raise self._classified(method, body["error"])
        if body.get("id") != request_id or "result" not in body:
            raise _bad_response("the answer has another id or no result")
        return body["result"]

    def _item(self, item: dict[str, Any], method: str) -> BatchAnswer:
        if item.get("error") is None:
            if "result" not in item:
                raise _bad_response("a batch item has neither result nor error")
            return BatchAnswer(result=item["result"])
        error = self._classified(method, item["error"])
        if isinstance(error, (RpcTransientError, MethodUnsupported)):
            raise error  # the whole batch goes to another URL
        return BatchAnswer(error=error)

    def _classified(self, method: str, error: object) -> RpcError:
        classified = classify_error(method, error)
        if isinstance(classified, LogRangeTooLarge):
            classified.url = self.label
        return classified


def _request(request_id: int, method: str, params: Sequence[Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": list(params)}


def _body(response: httpx.Response, method: str) -> Any:
    status = response.status_code
    if status == 429:
        raise RpcTransientError("HTTP 429", outcome="rate_limited",
                                retry_after=_retry_after(response.headers.get("retry-after")))
    if status >= 500:
        raise RpcTransientError(f"HTTP {status}", outcome="http_error")
    try:
        body = response.json()
    except ValueError:
        if status in _REFUSED:
            raise MethodUnsupported(f"{method}: HTTP {status}", method=method,
                                    code=status) from None
        raise RpcTransientError(f"HTTP {status} with a body that is not JSON",
                                outcome="bad_response") from None
    # A 4xx carrying a JSON-RPC error is classified by that error; any other is this URL's.
    if not 200 <= status < 300 and not (isinstance(body, dict) and body.get("error")):
        if status in _REFUSED:
            raise MethodUnsupported(f"{method}: HTTP {status}", method=method, code=status)
        raise RpcTransientError(f"HTTP {status}", outcome="http_error")
    return body


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (seconds or an HTTP date), None if absent or bad."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        return max(0.0, parsedate_to_datetime(value).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


def _quantity(value: Any) -> int:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise _bad_response(f"expected a hex quantity, got {str(value)[:40]}")
    try:
        return int(value, 16)
    except ValueError:
        raise _bad_response(f"expected a hex quantity, got {value[:40]}") from None


def _bad_response(message: str) -> RpcTransientError:
    return RpcTransientError(message, outcome="bad_response")


def _outcome(error: RpcError) -> str:
    return "range" if isinstance(error, LogRangeTooLarge) else "deterministic"
