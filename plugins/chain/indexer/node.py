"""What the indexer asks a chain's node: its head (watched for stalls), block headers, logs
by range or by block hash, a dpnm instance's parts, balances and block times. Every request
goes through the chain's RPC pool under one deadline, of which each URL gets
``rpc_timeout_seconds`` (the pool fails over within it).
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from functools import partial
from typing import Any, cast

import trio

from plugins.chain.abi import AbiDecodeError
from plugins.chain.endpoint import RpcEndpoint
from plugins.chain.health import CooldownPolicy
from plugins.chain.indexer.logs import RawLog
from plugins.chain.indexer.metrics import IndexerMetrics
from plugins.chain.indexer.store import BlockRef
from plugins.chain.logrange import LogChunk, LogRangeSizer, Topics, fetch_logs
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import ExecutionReverted, RpcTransientError
from plugins.chain.settings import ChainConfig
from plugins.chain.views import BALANCE_OF, ECOSYSTEM, Ecosystem

log = logging.getLogger("flowsvc.chain.indexer")


class ChainNode:
    """The requests of one chain's indexer, with what they learn on the way: the log range
    each URL accepts (``LogRangeSizer``) and when each URL's head last moved."""

    def __init__(self, chain: ChainConfig, pool: RpcPool, metrics: IndexerMetrics) -> None:
        self.chain = chain
        self.pool = pool
        self.metrics = metrics
        self.sizer = LogRangeSizer(cap=chain.max_log_range)
        self.head_seen: dict[str, tuple[int, float]] = {}
        self.rng = random.Random()

    async def head(self, min_final: int | None) -> int:
        """The head of the healthiest URL that is not behind ``min_final`` (the block the
        indexer holds final); the stall watchdog looks at it."""
        answered: list[RpcEndpoint] = []

        async def attempt(endpoint: RpcEndpoint, until: float) -> int:
            number = await endpoint.head(min_final=min_final, deadline=until)
            answered.append(endpoint)
            return number

        head = await self.pool.run(attempt, deadline=self._deadline())
        self.watch_stall(answered[-1], head)
        return head

    def watch_stall(self, endpoint: RpcEndpoint, head: int) -> None:
        now = trio.current_time()
        seen = self.head_seen.get(endpoint.label)
        if seen is None or head > seen[0]:
            self.head_seen[endpoint.label] = (head, now)
            return
        if now - seen[1] < self.chain.stall_timeout_seconds:
            return
        self.head_seen[endpoint.label] = (head, now)  # one count per stalled period
        self.metrics.stalls.labels(self.chain.name).inc()
        others = [other for other in self.pool.endpoints
                  if other is not endpoint and other.health.available(now)]
        if others:
            endpoint.health.failed(now, CooldownPolicy(), self.rng,
                                    retry_after=self.chain.stall_timeout_seconds)
            log.warning("chain %s: no new head from %s for %.0f s: failing over", self.chain.name,
                        endpoint.label, self.chain.stall_timeout_seconds)
        else:
            log.warning("chain %s: no new head from %s for %.0f s, and no other URL",
                        self.chain.name, endpoint.label, self.chain.stall_timeout_seconds)

    async def header(self, number: int) -> BlockRef:
        return await self.pool.run(lambda endpoint, until: endpoint.call_checked(
            "eth_getBlockByNumber", [hex(number), False], partial(_block_ref, number),
            deadline=until), deadline=self._deadline())

    async def headers(self, numbers: Sequence[int]) -> list[BlockRef]:
        """The headers of blocks ``numbers`` from one URL, in one JSON-RPC batch."""

        async def attempt(endpoint: RpcEndpoint, until: float) -> list[BlockRef]:
            answers = await endpoint.batch([("eth_getBlockByNumber", [hex(number), False])
                                            for number in numbers], deadline=until)
            return [_block_ref(number, answer.unwrap())
                    for number, answer in zip(numbers, answers, strict=True)]

        return await self.pool.run(attempt, deadline=self._deadline())

    async def logs_of_block(self, header: BlockRef, addresses: list[str]) -> list[RawLog]:
        def checked(result: Any) -> list[RawLog]:
            if not isinstance(result, list):
                raise RpcTransientError("eth_getLogs answered with something else than a list",
                                        outcome="bad_response")
            found = [RawLog.of(item) for item in result]
            if any(raw.block_hash != header.hash for raw in found):
                raise RpcTransientError("eth_getLogs by block hash answered logs of another "
                                        "block", outcome="bad_response")
            return found

        query = {"blockHash": header.hash, "address": addresses}
        return await self.pool.run(lambda endpoint, until: endpoint.call_checked(
            "eth_getLogs", [query], checked, deadline=until), deadline=self._deadline())

    async def logs_in(self, addresses: list[str], topics: Topics, first: int,
                      last: int) -> list[RawLog]:
        async with self.walk(addresses, topics, first, last) as chunks:
            return [RawLog.of(item) async for _start, _end, chunk in chunks for item in chunk]

    def walk(self, addresses: list[str], topics: Topics, first: int,
             last: int) -> aclosing[AsyncGenerator[LogChunk, None]]:
        """``fetch_logs`` closed on leaving (it is an async generator, typed as an iterator:
        one left early or by an error must not be left to the garbage collector)."""
        return aclosing(cast(AsyncGenerator[LogChunk, None], fetch_logs(
            self.pool, addresses, topics, first, last, self.sizer,
            chunk_timeout=self._timeout())))

    async def ecosystem(self, instance: str, block: str) -> Ecosystem | None:
        """The parts of dpnm ``instance``; None when it is no dpnm instance: no contract
        there (yet), or one without ``ecosystem()`` (a revert, or an answer of another
        shape)."""
        try:
            data = await self.pool.call("eth_call", [{"to": instance, "data": "0x"
                                                      + ECOSYSTEM.encode().hex()}, block],
                                        deadline=self._deadline())
            return ECOSYSTEM.decode(bytes.fromhex(str(data).removeprefix("0x")))
        except (ExecutionReverted, AbiDecodeError, ValueError):
            return None

    async def balances(self, token: str, addresses: Sequence[str], block: int) -> dict[str, int]:
        answers = await self.pool.batch(
            [("eth_call", [{"to": token, "data": "0x" + BALANCE_OF.encode(address).hex()},
                           hex(block)]) for address in addresses], deadline=self._deadline())
        return {address: BALANCE_OF.decode(bytes.fromhex(str(answer.unwrap())[2:]))
                for address, answer in zip(addresses, answers, strict=True)}

    async def block_times(self, numbers: Sequence[int]) -> dict[int, int]:
        answers = await self.pool.batch([("eth_getBlockByNumber", [hex(number), False])
                                         for number in numbers], deadline=self._deadline())
        return {number: int(answer.unwrap()["timestamp"], 16)
                for number, answer in zip(numbers, answers, strict=True)}

    def _timeout(self) -> float:
        """What one request may take, failover included: each URL gets its own timeout."""
        return self.chain.rpc_timeout_seconds * len(self.pool.endpoints)

    def _deadline(self) -> float:
        return trio.current_time() + self._timeout()


def _block_ref(number: int, result: Any) -> BlockRef:
    """Block ``number``'s header from an ``eth_getBlockByNumber`` answer.

    :raises RpcTransientError: the node does not know the block (the next URL may).
    """
    if not isinstance(result, dict):
        raise RpcTransientError(f"block {number} is unknown to this node",
                                outcome="missing_block")
    return BlockRef(int(result["number"], 16), str(result["hash"]).lower(),
                    str(result["parentHash"]).lower(), int(result["timestamp"], 16))
