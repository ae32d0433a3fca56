"""The RPC pool of one chain: its URLs used in order of health, failing over on transient
errors, each request under a deadline (an absolute time on Trio's clock, as in
``trio.move_on_at``) of which one URL gets at most ``attempt_timeout``, so a stalled URL leaves
time for the next. A URL that does not serve a method is skipped for that method; when no URL
serves it the chain cannot work (``MethodUnsupported``). See ``endpoint`` for one URL's requests
and ``rpc_errors`` for what is retried.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import httpx
import trio

from plugins.chain.endpoint import BatchAnswer, RpcEndpoint
from plugins.chain.health import CooldownPolicy
from plugins.chain.rpc_errors import (
    ChainIdMismatch,
    MethodUnsupported,
    RpcError,
    RpcTransientError,
    RpcUnavailable,
    redact_url,
)
from plugins.chain.rpc_metrics import NullObserver, RpcObserver

T = TypeVar("T")
Attempt = Callable[[RpcEndpoint, float], Awaitable[T]]


class RpcPool:
    """The RPC URLs of one chain, used in order of health, failing over on transient errors.

    :param urls: the chain's RPC URLs, in order of preference while none has been measured.
    :param client: the httpx client every request goes through; the caller owns and closes it.
    :param chain: a name for messages and metrics.
    :param attempt_timeout: the most seconds one URL gets within a call's deadline.
    :param observer: receives every request (see ``rpc_metrics``); nothing is recorded if None.
    :param rng: the jitter's random source (seed it in tests).
    :raises ValueError: no URL given.
    """

    def __init__(self, urls: Sequence[str], client: httpx.AsyncClient, *, chain: str = "",
                 attempt_timeout: float = 5.0, cooldown: CooldownPolicy | None = None,
                 observer: RpcObserver | None = None, rng: random.Random | None = None) -> None:
        if not urls:
            raise ValueError(f"chain {chain!r} has no RPC URL")
        self.chain = chain
        self.attempt_timeout = attempt_timeout
        self.expected_chain_id: int | None = None
        ids = itertools.count(1)
        cooldown = cooldown or CooldownPolicy()
        observer = observer or NullObserver()
        rng = rng or random.Random()
        labels: list[str] = []
        for url in urls:
            label = redact_url(url)
            labels.append(label if label not in labels else f"{label}#{len(labels) + 1}")
        self.endpoints = [
            RpcEndpoint(url, label, client, ids=ids, cooldown=cooldown, observer=observer,
                        rng=rng)
            for url, label in zip(urls, labels, strict=True)]

    async def call(self, method: str, params: Sequence[Any], *, deadline: float) -> Any:
        """Return the result of ``method``, failing over between URLs until ``deadline``.

        :raises MethodUnsupported: no URL of the chain serves ``method``.
        :raises RpcDeterministicError: the request is wrong (never retried).
        :raises LogRangeTooLarge: the URL refuses this ``eth_getLogs`` range.
        :raises RpcUnavailable: no URL answered in time, or every one is cooling down.
        """
        return await self.run(
            lambda endpoint, until: endpoint.call(method, params, deadline=until),
            deadline=deadline)

    async def batch(self, calls: Sequence[tuple[str, Sequence[Any]]], *,
                    deadline: float) -> list[BatchAnswer]:
        """Send ``calls`` as one JSON-RPC batch to one URL (failing over as a whole) and return
        their answers in order (none for no calls). Raises as ``call``."""
        if not calls:
            return []
        return await self.run(
            lambda endpoint, until: endpoint.batch(calls, deadline=until), deadline=deadline)

    async def head(self, min_final: int | None = None, *, deadline: float) -> int:
        """Return the latest block number from a URL whose head is not behind ``min_final``;
        a URL that lags is cooled down, counted (outcome ``lagging``) and the next one tried.

        :raises RpcUnavailable: no URL with a head at or past ``min_final`` answered in time.
        """
        return await self.run(
            lambda endpoint, until: endpoint.head(min_final=min_final, deadline=until),
            deadline=deadline)

    async def check_chain_ids(self, expected: int, *, deadline: float) -> list[str]:
        """Check every URL's ``eth_chainId`` against ``expected``, all at once. A URL that
        cannot answer now is checked before its first use instead; its label is returned.

        :raises ChainIdMismatch: naming each (redacted) URL that serves another chain.
        """
        self.expected_chain_id = expected
        mismatches: list[tuple[str, int]] = []
        unchecked: list[str] = []

        async def check(endpoint: RpcEndpoint) -> None:
            try:
                await endpoint.verify_chain_id(expected, deadline=deadline)
            except ChainIdMismatch as error:
                mismatches.extend(error.mismatches)
            except RpcError:
                unchecked.append(endpoint.label)

        async with trio.open_nursery() as nursery:
            for endpoint in self.endpoints:
                nursery.start_soon(check, endpoint)
        if mismatches:
            raise ChainIdMismatch(expected, sorted(mismatches))
        return sorted(unchecked)

    async def run(self, attempt: Attempt[T], *, deadline: float) -> T:
        """Run ``attempt(endpoint, attempt_deadline)`` on the available URLs, best first, each
        at most once, until one returns; what the attempt raises other than
        ``RpcTransientError`` or ``MethodUnsupported`` propagates at once. The building block
        of every pool request.

        :raises MethodUnsupported: a method the attempt needs is served by no URL of the pool.
        :raises RpcUnavailable: every URL is cooling down (at once), or each one tried failed
            transiently, or ``deadline`` passed.
        """
        now = trio.current_time()
        ready = sorted((endpoint for endpoint in self.endpoints if endpoint.health.available(now)),
                       key=lambda endpoint: endpoint.health.score())
        if not ready:
            raise RpcUnavailable(f"chain {self.chain}: every RPC URL is cooling down",
                                 retry_after=self._next_available(now))
        failures: list[str] = []
        unsupported: set[str] = set()
        for endpoint in ready:
            now = trio.current_time()
            if now >= deadline:
                failures.append("deadline passed")
                break
            if not endpoint.health.available(now):  # another task's request just failed it
                continue
            until = min(deadline, now + self.attempt_timeout)
            try:
                if self.expected_chain_id is not None and endpoint.chain_id is None:
                    await endpoint.verify_chain_id(self.expected_chain_id, deadline=until)
                return await attempt(endpoint, until)
            except (RpcTransientError, ChainIdMismatch) as error:
                failures.append(f"{endpoint.label}: {error}")
            except MethodUnsupported as error:
                failures.append(f"{endpoint.label}: {error}")
                unsupported.add(error.method)
        now = trio.current_time()
        for method in sorted(unsupported):
            if not any(endpoint.health.supports(method, now) for endpoint in self.endpoints):
                raise MethodUnsupported(f"chain {self.chain}: no RPC URL serves {method} "
                                        f"({'; '.join(failures)})", method=method)
        raise RpcUnavailable(f"chain {self.chain}: no RPC URL answered ({'; '.join(failures)})",
                             retry_after=self._next_available(trio.current_time()))

    def _next_available(self, now: float) -> float | None:
        waits = [endpoint.health.cooling_until - now for endpoint in self.endpoints
                 if math.isfinite(endpoint.health.cooling_until)]
        return max(0.0, min(waits)) if waits else None
