"""The indexer's tests: a service indexing chains, waiting for it, and what the contracts
say the indexed counters should be."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from plugins.chain.indexed import IndexedHead, indexed_head
from plugins.chain.state import CHAIN
from runtime.server import Running
from runtime.service import Service
from tests.support.chain.anvil import Anvil, running_anvil
from tests.support.chain.contracts import open_chain
from tests.support.chain.deploy import Deployment, Dpnm, deploy_stack
from tests.support.chain.rpc import Rpc
from tests.support.chain.service import chains_env
from tests.support.projects import EventRecorder
from tests.support.server import make_settings, running_server
from tests.support.tokens import chain_env


@contextmanager
def deployed_anvil(chain_id: int) -> Iterator[tuple[Anvil, Deployment]]:
    """An anvil of ``chain_id`` with the reference stack deployed (in a Trio run of its own,
    for module-scoped fixtures): a second chain beside the module's ``anvil``."""
    with running_anvil(chain_id) as node:
        yield node, trio.run(_deploy, node.url)


async def _deploy(url: str) -> Deployment:
    async with open_chain(url) as chain:
        return await deploy_stack(chain)


def indexer_env(var_dir: Path, database_url: str, chains: Sequence[dict[str, Any]],
                extra: dict[str, str] | None = None) -> dict[str, str]:
    """A service with the auth and chain plugins indexing ``chains``."""
    return {**chain_env(var_dir, database_url), **chains_env(chains), **(extra or {})}


@asynccontextmanager
async def indexing(var_dir: Path, database_url: str, chains: Sequence[dict[str, Any]],
                   extra: dict[str, str] | None = None
                   ) -> AsyncIterator[tuple[Running, EventRecorder]]:
    """A running service indexing ``chains``, with a recorder of the events it emits."""
    env = indexer_env(var_dir, database_url, chains, extra)
    recorder = EventRecorder()
    async with running_server(make_settings(env), env) as running:
        running.service.pm.register(recorder, name="indexer-test-events")
        yield running, recorder


async def head_number(rpc: Rpc) -> int:
    return int(await rpc.call("eth_blockNumber"), 16)


async def until_final(service: Service, chain_id: int, number: int,
                      timeout: float = 30.0) -> IndexedHead:
    """Wait until ``service`` holds block ``number`` of ``chain_id`` as final and indexed."""
    with trio.fail_after(timeout):
        while True:
            head = await service.db.read(indexed_head, chain_id)
            if head is not None and head.final_number is not None \
                    and head.final_number >= number:
                return head
            await trio.sleep(0.05)


async def until_indexed(service: Service, chain_id: int, number: int, block_hash: str,
                        timeout: float = 30.0) -> None:
    """Wait until ``service``'s indexed head of ``chain_id`` is block ``number`` with
    ``block_hash`` (the branch a test expects)."""
    with trio.fail_after(timeout):
        while True:
            head = await service.db.read(indexed_head, chain_id)
            if head is not None and head.number == number and head.hash == block_hash.lower():
                return
            await trio.sleep(0.05)


def indexer_state(service: Service, chain_id: int) -> str:
    return service.state(CHAIN).indexers[chain_id].state


@dataclass(frozen=True)
class Expected:
    """What the indexer should find for a dpnm instance, read from the node's own logs."""

    tree_positions: int
    fees_usdt: int
    gwt_minted: int
    earned: dict[str, list[int]]


async def expected_of(dpnm: Dpnm, block: int) -> Expected:
    """Sum the instance's logs up to ``block`` as the spec defines the counters."""
    rpc = dpnm.protocol.chain.rpc
    logs: list[dict[str, Any]] = await rpc.call("eth_getLogs", {
        "address": [dpnm.protocol.address, dpnm.tree.address], "fromBlock": "0x0",
        "toBlock": hex(block)})
    earned: dict[str, list[int]] = {}
    for event in dpnm.protocol.events(logs, "RewardPaid"):
        earned.setdefault(event["ancestor"].lower(), [0] * 10)[event["levelIndex"]] += \
            event["amount"]
    return Expected(
        tree_positions=len(dpnm.tree.events(logs, "UserPlaced")),
        fees_usdt=sum(event["usdtIn"] * 2_000 // 10_000
                      for event in dpnm.protocol.events(logs, "Bought")),
        gwt_minted=sum(event["amount"] for event in dpnm.protocol.events(logs, "GWTClaimed")),
        earned=earned)
