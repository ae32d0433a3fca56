"""Concurrent on-chain reads of one chain share its exchanges with the node
(``plugins.chain.onchain.coalescing``), against a real anvil.

One module-wide chain: the reference stack and six wallets, each activated and holding its
own amount of USDT, so every wallet's position differs from the others'. The exchanges are
counted by the service's own RPC metrics (``flowsvc_chain_rpc_requests_total``: a batch is
one request with method ``batch``).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from eth_account import Account
from eth_account.signers.local import LocalAccount

from plugins.chain.indexed import indexed_head
from plugins.chain.onchain.coalescing import CallCoalescer
from plugins.chain.onchain.reads import Chain, FlowPosition, flow_position_batch
from plugins.chain.onchain.routes import ONCHAIN
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import RpcUnavailable
from plugins.chain.state import CHAIN
from plugins.chain.views import Ecosystem
from runtime.server import Running
from tests.support.chain.actions import activate, fund_usdt
from tests.support.chain.anvil import Anvil, running_anvil
from tests.support.chain.contracts import open_chain
from tests.support.chain.deploy import UNIT, Deployment, deploy_stack, dpnm_of
from tests.support.chain.rpc_proxy import running_proxy
from tests.support.server import client, make_settings, running_server
from tests.support.tokens import chain_env
from tests.support.wallet import sign_in

CHAIN_ID = 31337
NAME = "alpha"
WALLETS = 6
INDEXED_WITHIN = 60.0  # seconds the indexer gets to catch up on a loaded machine


@dataclass(frozen=True)
class World:
    anvil: Anvil
    deployment: Deployment
    wallets: list[LocalAccount]

    def usdt_of(self, index: int) -> int:
        return (index + 1) * 7 * UNIT


async def _build(anvil: Anvil) -> World:
    async with open_chain(anvil.url) as chain:
        deployment = await deploy_stack(chain)
        dpnm = dpnm_of(chain, deployment.platform, deployment.dpnm)
        wallets: list[LocalAccount] = [Account.create() for _ in range(WALLETS)]
        world = World(anvil, deployment, wallets)
        for index, wallet in enumerate(wallets):
            await chain.rpc.call("anvil_setBalance", wallet.address, hex(10**20))
            await activate(dpnm, wallet, dpnm.root.address)
            await fund_usdt(dpnm, wallet, world.usdt_of(index))
        return world


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with running_anvil(CHAIN_ID) as anvil:
        yield trio.run(_build, anvil)


@pytest.fixture
async def running(world: World, tmp_path: Path) -> AsyncIterator[Running]:
    deployment = world.deployment
    chains = [{"id": CHAIN_ID, "name": NAME, "rpc_urls": [world.anvil.url],
               "factory": deployment.platform.factory, "usdt": deployment.platform.usdt,
               "flow_instance": deployment.dpnm.instance, "poll_interval_seconds": 0.2,
               "rpc_timeout_seconds": 10}]
    env = {**chain_env(tmp_path / "var", f"sqlite:///{tmp_path / 'flowsvc.db'}"),
           "FLOWSVC_PLUGINS_CHAIN_CHAINS": json.dumps(chains)}
    async with running_server(make_settings(env), env) as served:
        await _indexed_to_head(served, world)
        yield served


async def _indexed_to_head(running: Running, world: World) -> None:
    """Wait for the indexer's catch-up: it makes eth_calls of its own (an instance's parts)."""
    async with open_chain(world.anvil.url) as chain:
        head = int(await chain.rpc.call("eth_blockNumber"), 16)
    with trio.fail_after(INDEXED_WITHIN):
        while True:
            indexed = await running.service.db.read(indexed_head, CHAIN_ID)
            if indexed is not None and indexed.number >= head:
                return
            await trio.sleep(0.1)


def _exchanges(running: Running) -> dict[str, float]:
    """The chain's ``eth_call`` and ``batch`` requests so far, from the service's metrics."""
    label = running.service.state(CHAIN).pools[CHAIN_ID].endpoints[0].label
    registry = running.service.metrics.registry
    return {method: registry.get_sample_value(
        "flowsvc_chain_rpc_requests_total",
        {"chain": NAME, "url": label, "method": method, "outcome": "ok"}) or 0.0
        for method in ("eth_call", "batch")}


def _chain(running: Running) -> Chain:
    config = running.service.state(CHAIN).chains[CHAIN_ID]
    return Chain(config.id, config.name, running.service.state(CHAIN).pools[CHAIN_ID],
                 config.multicall3, config.usdt, config.flow_instance,
                 trio.current_time() + 30)


async def test_concurrent_reads_share_one_batch_and_keep_their_own_answers(
        running: Running, world: World) -> None:
    reads = running.service.state(ONCHAIN)
    chain = _chain(running)
    await reads.ecosystem(chain, chain.flow_instance)  # the instance's parts, read once
    before = _exchanges(running)
    positions: dict[str, FlowPosition] = {}

    async def read(wallet: LocalAccount) -> None:
        positions[wallet.address] = await reads.flow_position(chain, wallet.address)

    async with trio.open_nursery() as nursery:
        for wallet in world.wallets:
            nursery.start_soon(read, wallet)
    after = _exchanges(running)
    # The first call left alone; the five made while it was under way left as one batch.
    assert (after["eth_call"] - before["eth_call"], after["batch"] - before["batch"]) == (1, 1)
    assert reads.coalescers[CHAIN_ID].busy is False

    reads.cache_seconds = 0.0  # each wallet read again, alone: the very same position
    for index, wallet in enumerate(world.wallets):
        position = positions[wallet.address]
        assert position.usdt_balance == world.usdt_of(index) and position.state.activated
        assert await reads.flow_position(chain, wallet.address) == position


async def test_concurrent_requests_each_get_their_own_wallet(running: Running,
                                                              world: World) -> None:
    clients = [client(running) for _ in world.wallets]
    for http, wallet in zip(clients, world.wallets, strict=True):
        await sign_in(http, wallet)
    bodies: dict[int, dict[str, Any]] = {}

    async def get(index: int, http: httpx.AsyncClient) -> None:
        response = await http.get("/me/flow-onchain")
        assert response.status_code == 200, response.text
        bodies[index] = response.json()

    before = _exchanges(running)
    async with trio.open_nursery() as nursery:
        for index, http in enumerate(clients):
            nursery.start_soon(get, index, http)
    after = _exchanges(running)
    for http in clients:
        await http.aclose()
    for index, wallet in enumerate(world.wallets):
        body = bodies[index]
        assert body["address"] == wallet.address.lower()
        [entry] = body["chains"]
        assert entry["usdtBalance"] == str(world.usdt_of(index) // UNIT)
    # However the requests overlapped, never more exchanges than requests.
    assert sum(after.values()) - sum(before.values()) <= len(world.wallets)


async def test_a_sender_that_leaves_does_not_strand_its_batch(world: World) -> None:
    """The caller sending a batch is cancelled while the node holds it: the others of its
    batch are sent again by the next of them; a caller whose deadline passes in the queue
    gets ``RpcUnavailable``; the coalescer ends free."""
    parts = world.deployment.dpnm
    ecosystem = Ecosystem(parts.flow, parts.gwt, parts.tree, parts.protocol)
    params = [flow_position_batch(world.deployment.platform.multicall,
                                  world.deployment.platform.usdt, ecosystem,
                                  wallet.address)[0].params(None)
              for wallet in world.wallets[:4]]
    async with running_proxy(world.anvil.url) as proxy, httpx.AsyncClient() as http:
        proxy.stall_seconds = 1.0
        coalescer = CallCoalescer(RpcPool([proxy.url], http, chain=NAME, attempt_timeout=30))
        deadline = trio.current_time() + 30
        results: dict[int, object] = {}
        leaving = trio.CancelScope()

        async def call(index: int, until: float) -> None:
            try:
                results[index] = await coalescer.call(params[index], deadline=until)
            except RpcUnavailable as error:
                results[index] = error

        async def sender() -> None:
            with leaving:
                await call(1, deadline)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, 0, deadline)  # alone: leaves at once, held 1 s
            await trio.sleep(0.1)
            nursery.start_soon(sender)  # first in the queue: sends the next batch
            await trio.sleep(0.1)  # (Trio runs tasks started together in any order)
            nursery.start_soon(call, 2, deadline)
            nursery.start_soon(call, 3, trio.current_time() + 0.5)  # gives up in the queue
            await trio.sleep(1.4)  # call 0 answered; calls 1 and 2 held as one batch
            assert 1 not in results and 2 not in results
            leaving.cancel()
        assert isinstance(results[3], RpcUnavailable)
        assert 1 not in results
        assert isinstance(results[0], str) and results[2] != results[0]
        assert coalescer.busy is False and coalescer.queue == []
        # Call 2 went out twice: in the batch its sender left, then alone.
        assert proxy.methods["eth_call"] == 4


async def test_the_exchange_and_its_next_sender_cancelled_at_once(world: World) -> None:
    """The exchange under way and the first queued caller are cancelled at once (both
    requests went away), in whichever order Trio runs them: the chain ends free and the
    next call is answered."""
    parts = world.deployment.dpnm
    ecosystem = Ecosystem(parts.flow, parts.gwt, parts.tree, parts.protocol)
    params = flow_position_batch(world.deployment.platform.multicall,
                                 world.deployment.platform.usdt, ecosystem,
                                 world.wallets[0].address)[0].params(None)
    async with running_proxy(world.anvil.url) as proxy, httpx.AsyncClient() as http:
        proxy.stall_seconds = 0.3
        coalescer = CallCoalescer(RpcPool([proxy.url], http, chain=NAME, attempt_timeout=30))

        async def call(scope: trio.CancelScope) -> None:
            with scope:
                await coalescer.call(params, deadline=trio.current_time() + 30)

        for _ in range(10):
            scopes = [trio.CancelScope(), trio.CancelScope()]
            async with trio.open_nursery() as nursery:
                nursery.start_soon(call, scopes[0])  # alone: under way
                await trio.sleep(0.05)
                nursery.start_soon(call, scopes[1])  # queued
                await trio.sleep(0.05)
                scopes[1].cancel()
                scopes[0].cancel()
            assert coalescer.busy is False and coalescer.queue == []
        answer = await coalescer.call(params, deadline=trio.current_time() + 30)
        assert isinstance(answer, str) and answer.startswith("0x")
