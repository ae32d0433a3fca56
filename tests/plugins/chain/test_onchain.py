"""The on-chain read endpoints over real HTTP, against two real anvil chains.

One module-wide world: two anvils with different chain ids, the reference stack deployed on
each, and on chain A a user who activates, buys, sells, extends their tree and claims GWT,
with four users below them who buy (so they earn rewards and pending GWT). Each test runs a
service whose chains are reached through loopback proxies (which count the RPC methods and
can be taken down). Every figure is checked against the contracts' own views, read directly
at the block the service says it read.
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

from plugins.auth.identities import new_access_codes
from plugins.chain.indexed import indexed_head
from plugins.chain.indexer.final import token_slug
from plugins.chain.onchain.routes import ONCHAIN
from plugins.chain.state import CHAIN
from runtime.server import Running
from tests.support.backends import POSTGRES_URL, postgres_schema
from tests.support.chain.actions import (
    bonding_buy,
    buy,
    claim_gwt,
    extend_tree,
    fund_asset,
    fund_usdt,
    join,
    mine,
    sell,
)
from tests.support.chain.anvil import Anvil, running_anvil
from tests.support.chain.contracts import Chain, open_chain
from tests.support.chain.deploy import (
    UNIT,
    ZERO_ADDRESS,
    Deployment,
    Dpnm,
    Virtuals,
    VirtualsAddresses,
    deploy_stack,
    dpnm_of,
    launch_virtuals,
    virtuals_of,
)
from tests.support.chain.rpc_proxy import RpcProxy, running_proxy
from tests.support.server import INTERNAL, client, make_settings, running_server
from tests.support.tokens import chain_env
from tests.support.wallet import sign_in

CHAIN_IDS = (31337, 31338)
NAMES = ("alpha", "beta")
DAY = 86_400
INDEXED_WITHIN = 60.0  # seconds the indexer gets to catch up on a loaded machine


@dataclass(frozen=True)
class World:
    anvils: tuple[Anvil, Anvil]
    deployments: tuple[Deployment, Deployment]
    user_key: str
    earned_by_level: list[int]  # what the user's RewardPaid events paid, by level
    fees: int  # 20% of every buy on chain A's instance
    gwt_claimed: int
    graduated: VirtualsAddresses  # a second bonding-curve token, bought past its threshold


def _fee(receipt_amount: int) -> int:
    return receipt_amount * 2_000 // 10_000


async def _build(anvils: tuple[Anvil, Anvil]) -> World:
    async with open_chain(anvils[0].url) as chain_a, open_chain(anvils[1].url) as chain_b:
        deployment_a = await deploy_stack(chain_a)
        deployment_b = await deploy_stack(chain_b)
        dpnm = dpnm_of(chain_a, deployment_a.platform, deployment_a.dpnm)
        await fund_usdt(dpnm, dpnm.root, 1_000 * UNIT)
        await extend_tree(dpnm, dpnm.root, 1)
        user = await join(dpnm, dpnm.root.address, usdt=1_000 * UNIT, months=1)
        bought = [40 * UNIT]
        await buy(dpnm, user, 40 * UNIT)
        earned = [0] * 10
        # Three fill the user's slots, the fourth lands one level deeper.
        below = [await join(dpnm, user.address, usdt=200 * UNIT) for _ in range(4)]

        async def bought_by(buyer: LocalAccount, amount: int) -> None:
            receipt = await buy(dpnm, buyer, amount)
            bought.append(amount)
            for paid in dpnm.protocol.events(receipt, "RewardPaid"):
                if paid["ancestor"] == user.address:
                    earned[paid["levelIndex"]] += paid["amount"]

        for amount, buyer in ((25 * UNIT, below[0]), (30 * UNIT, below[1]),
                              (20 * UNIT, below[2]), (45 * UNIT, below[3])):
            await bought_by(buyer, amount)
        claimed = dpnm.protocol.events(await claim_gwt(dpnm, user), "GWTClaimed")
        await extend_tree(dpnm, user, 1)
        await sell(dpnm, user, 5 * UNIT)
        await bought_by(below[0], 20 * UNIT)  # pending GWT again after the claim
        virtuals = virtuals_of(chain_a, deployment_a.platform, deployment_a.virtuals)
        trader = await chain_a.new_account()
        await fund_asset(virtuals, trader, 500 * UNIT)
        await bonding_buy(virtuals, trader, 500 * UNIT)
        # Constant product from 6,000 of virtual liquidity: 42,000 of the asset leaves 1/8
        # of the supply in the pair, the graduation threshold.
        graduating = await launch_virtuals(chain_a, deployment_a.platform, "Agent Two", "ATWO")
        await fund_asset(graduating, trader, 45_000 * UNIT)
        await bonding_buy(graduating, trader, 42_000 * UNIT)
        return World(anvils, (deployment_a, deployment_b), user.key.hex(), earned,
                     sum(_fee(amount) for amount in bought),
                     sum(event["amount"] for event in claimed),
                     VirtualsAddresses(graduating.token.address, graduating.pair.address))


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    with running_anvil(CHAIN_IDS[0]) as anvil_a, running_anvil(CHAIN_IDS[1]) as anvil_b:
        yield trio.run(_build, (anvil_a, anvil_b))


@pytest.fixture
def database_url(tmp_path: Path) -> Iterator[str]:
    """PostgreSQL when the run has one (CI does), else SQLite."""
    if POSTGRES_URL:
        with postgres_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}"


@dataclass
class Served:
    running: Running
    proxies: tuple[RpcProxy, RpcProxy]

    def eth_calls(self) -> tuple[int, int]:
        return self.proxies[0].methods["eth_call"], self.proxies[1].methods["eth_call"]


@pytest.fixture
async def served(world: World, tmp_path: Path, database_url: str) -> AsyncIterator[Served]:
    async with running_proxy(world.anvils[0].url) as proxy_a, \
            running_proxy(world.anvils[1].url) as proxy_b:
        chains = [{"id": chain_id, "name": name, "rpc_urls": [proxy.url],
                   "factory": deployment.platform.factory, "usdt": deployment.platform.usdt,
                   "flow_instance": deployment.dpnm.instance, "finality_depth": 2,
                   "poll_interval_seconds": 0.2, "rpc_timeout_seconds": 3}
                  for chain_id, name, proxy, deployment in zip(
                      CHAIN_IDS, NAMES, (proxy_a, proxy_b), world.deployments, strict=True)]
        env = {**chain_env(tmp_path / "var", database_url),
               "FLOWSVC_PLUGINS_CHAIN_CHAINS": json.dumps(chains)}
        async with running_server(make_settings(env), env) as running:
            yield Served(running, (proxy_a, proxy_b))


def _user(world: World) -> LocalAccount:
    account: LocalAccount = Account.from_key(world.user_key)
    return account


def _amount(value: int) -> str:
    """An 18-decimal amount as the API writes it, computed here independently."""
    whole, fraction = divmod(value, UNIT)
    digits = f"{fraction:018d}".rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


def _address(value: str) -> str | None:
    return None if value == ZERO_ADDRESS or int(value, 16) == 0 else value.lower()


async def _levels_below(dpnm: Dpnm, address: str, block: int, depth: int) -> list[int]:
    """The subtree of ``address`` counted level by level, walked here with getChild."""
    levels, frontier = [0] * 10, [address]
    for level in range(depth):
        frontier = [child for node in frontier for slot in range(3)
                    if (child := await dpnm.tree.call("getChild", node, slot, block=block))
                    != ZERO_ADDRESS]
        levels[level] = len(frontier)
    return levels


async def _until_indexed(http: httpx.AsyncClient, path: str, ready: Any) -> dict[str, Any]:
    """GET ``path`` until ``ready(body)`` holds: the indexer catches up in the background."""
    with trio.fail_after(INDEXED_WITHIN):
        while True:
            response = await http.get(path)
            body: dict[str, Any] = response.json()
            if response.status_code == 200 and ready(body):
                return body
            assert response.status_code == 200 or _error(response) == (
                503, "token_not_indexed"), response.text
            await trio.sleep(0.2)


async def _indexed_to_heads(served: Served, world: World) -> None:
    """Wait until the indexer has caught up with both chains: it makes eth_calls of its own
    (a launched instance's parts) while it reads their history."""
    with trio.fail_after(INDEXED_WITHIN):
        for chain_id, anvil in zip(CHAIN_IDS, world.anvils, strict=True):
            async with open_chain(anvil.url) as chain:
                head = int(await chain.rpc.call("eth_blockNumber"), 16)
            while True:
                indexed = await served.running.service.db.read(indexed_head, chain_id)
                if indexed is not None and indexed.number >= head:
                    break
                await trio.sleep(0.1)


async def _mine_until_seen(served: Served, world: World) -> int:
    """Mine a block on chain A and wait until the service's pool has seen it (the indexer
    polls the head); return its number."""
    async with open_chain(world.anvils[0].url) as chain:
        await mine(chain.rpc)
        mined = int(await chain.rpc.call("eth_blockNumber"), 16)
    pool = served.running.service.state(CHAIN).pools[CHAIN_IDS[0]]
    with trio.fail_after(INDEXED_WITHIN):
        while True:
            if max(endpoint.head_seen or 0 for endpoint in pool.endpoints) >= mined:
                return mined
            await trio.sleep(0.05)


async def test_flow_onchain_is_every_field_of_the_views_in_one_eth_call_per_chain(
        served: Served, world: World) -> None:
    user = _user(world)
    await _indexed_to_heads(served, world)
    async with client(served.running) as warm, client(served.running) as http:
        await sign_in(warm)
        # A wallet with no activity anywhere: no chain listed. The instances' immutable
        # addresses are read on this first request, once per process.
        assert (await warm.get("/me/flow-onchain")).json()["chains"] == []
        await sign_in(http, user)
        before = served.eth_calls()
        response = await http.get("/me/flow-onchain")
        after = served.eth_calls()
        assert response.status_code == 200, response.text
        assert (after[0] - before[0], after[1] - before[1]) == (1, 1)
        body = response.json()
        assert body["address"] == user.address.lower() and body["unavailable"] == []
        [entry] = body["chains"]  # no activity on chain B
        assert (entry["chainId"], entry["chainName"]) == (CHAIN_IDS[0], NAMES[0])

        async with open_chain(world.anvils[0].url) as chain:
            await _check_flow_entry(chain, world, user.address, entry)
        served.running.service.state(ONCHAIN).cache_seconds = 600.0
        repeated = await http.get("/me/flow-onchain")
        assert served.eth_calls() == after  # the position came from the cache
        assert repeated.json()["chains"][0]["blockNumber"] == entry["blockNumber"]
        mined = await _mine_until_seen(served, world)
        newer = await http.get("/me/flow-onchain")  # a newer block of A retires A's entry
        assert served.eth_calls() == (after[0] + 1, after[1])
        assert newer.json()["chains"][0]["blockNumber"] == mined
        indexed = await _until_indexed(
            http, "/me/flow-onchain",
            lambda body: body["chains"][0]["lifetimeIncome"] != "0"
            and sum(body["chains"][0]["tree"]["subtreeByLevel"]) > 0)
        [entry] = indexed["chains"]
        assert entry["lifetimeIncome"] == _amount(sum(world.earned_by_level))
        assert entry["tree"]["subtreeByLevel"] == [3, 1] + [0] * 8

        chosen = await http.get("/me/flow-onchain", params={"chainId": CHAIN_IDS[0]})
        assert [item["chainId"] for item in chosen.json()["chains"]] == [CHAIN_IDS[0]]
        assert _error(await http.get("/me/flow-onchain", params={"chainId": CHAIN_IDS[1]})
                      ) == (404, "address_not_activated")
        assert _error(await http.get("/me/flow-onchain", params={"chainId": 5})
                      ) == (400, "chain_unsupported")
        assert _error(await http.get("/me/flow-onchain", params={"chainId": "x"})
                      ) == (400, "invalid_request")


async def _check_flow_entry(chain: Chain, world: World, address: str,
                            entry: dict[str, Any]) -> None:
    deployment = world.deployments[0]
    dpnm = dpnm_of(chain, deployment.platform, deployment.dpnm)
    block = entry["blockNumber"]
    state = await dpnm.protocol.call("userState", address, block=block)
    (activated, income_limit, _lifetime, day_start, bought_today, credit, credit_until,
     active_until, gwt_pending) = state
    stamp = int((await chain.rpc.call("eth_getBlockByNumber", hex(block), False))["timestamp"],
                16)
    daily_max = await dpnm.protocol.call("dailyLimitMax", block=block)
    remaining = (daily_max - (bought_today if stamp < day_start + DAY else 0)
                 + (credit if stamp < credit_until else 0))
    assert activated and credit > 0 and gwt_pending > 0 and active_until > stamp
    assert entry == {
        "chainId": CHAIN_IDS[0], "chainName": NAMES[0], "blockNumber": block,
        "flowBalance": _amount(await dpnm.flow.call("balanceOf", address, block=block)),
        "usdtBalance": _amount(await dpnm.usdt.call("balanceOf", address, block=block)),
        "gwtBalance": _amount(await dpnm.gwt.call("balanceOf", address, block=block)),
        "currentPrice": _amount(await dpnm.protocol.call("priceFLOW", block=block)),
        "dailyLimitTotal": _amount(daily_max),
        "dailyLimitRemaining": _amount(remaining),
        "incomeLimitRemaining": _amount(income_limit),
        "lifetimeIncome": entry["lifetimeIncome"],  # indexed: checked once caught up
        "treeActiveUntil": active_until,
        "treeActiveDaysLeft": -(-(active_until - stamp) // DAY),
        "claimableGWT": _amount(gwt_pending),
        "tree": {
            "upline": _address(await dpnm.tree.call("getParent", address, block=block)),
            "directSlots": [_address(await dpnm.tree.call("getChild", address, slot,
                                                          block=block)) for slot in range(3)],
            "subtreeSize": await dpnm.tree.call("getSubtreeSize", address, block=block),
            "subtreeByLevel": entry["tree"]["subtreeByLevel"],  # indexed, as above
        },
    }
    assert world.gwt_claimed > 0 and entry["gwtBalance"] == _amount(world.gwt_claimed)


async def test_tree_walks_depth_levels_with_indexed_earnings(served: Served,
                                                             world: World) -> None:
    user = _user(world)
    async with client(served.running) as http:
        await sign_in(http, user)
        body = await _until_indexed(http, "/me/tree",
                                    lambda body: body["lifetimeEarnedByLevel"][0] != "0")
        assert body["lifetimeEarnedByLevel"] == [_amount(amount)
                                                 for amount in world.earned_by_level]
        async with open_chain(world.anvils[0].url) as chain:
            deployment = world.deployments[0]
            dpnm = dpnm_of(chain, deployment.platform, deployment.dpnm)
            block = body["blockNumber"]
            directs = []
            for slot in range(3):
                child = await dpnm.tree.call("getChild", user.address, slot, block=block)
                directs.append({
                    "address": child.lower(),
                    "active": await dpnm.tree.call("isActive", child, block=block),
                    "subtreeSize": await dpnm.tree.call("getSubtreeSize", child,
                                                        block=block)})
            assert body == {
                "address": user.address.lower(), "chainId": CHAIN_IDS[0],
                "blockNumber": block, "depth": 3,
                "upline": _address(await dpnm.tree.call("getParent", user.address,
                                                        block=block)),
                "subtreeByLevel": await _levels_below(dpnm, user.address, block, 3),
                "lifetimeEarnedByLevel": body["lifetimeEarnedByLevel"],
                "directs": directs}
            assert body["subtreeByLevel"][:2] == [3, 1]
            shallow = (await http.get("/me/tree", params={"depth": 1})).json()
            assert shallow["subtreeByLevel"] == [3] + [0] * 9
            assert shallow["directs"] == directs
            root = dpnm.root.address
        for depth in ("0", "11", "x", "2.5"):
            assert _error(await http.get("/me/tree", params={"depth": depth})
                          ) == (400, "invalid_request"), depth
        assert _error(await http.get("/me/tree", params={"chainId": CHAIN_IDS[1]})
                      ) == (404, "address_not_activated")
        assert _error(await http.get("/me/tree", params={"chainId": 7})
                      ) == (400, "chain_unsupported")
    async with client(served.running) as http:
        await sign_in(http, Account.from_key(deployment.dpnm.root_key))
        whole = (await http.get("/me/tree", params={"depth": 10})).json()
        assert whole["upline"] is None and root.lower() == whole["address"]
        assert whole["subtreeByLevel"] == [1, 3, 1] + [0] * 7


async def test_token_onchain_dpnm_and_virtuals(served: Served, world: World) -> None:
    deployment = world.deployments[0]
    slugs: dict[str, str] = {}
    async with httpx.AsyncClient(base_url=served.running.base_url, timeout=30) as internal:
        for slug, template, instance in (("flowa", "dpnm", deployment.dpnm.instance),
                                         ("agent-one", "virtuals", deployment.virtuals.token),
                                         ("agent-two", "virtuals", world.graduated.token)):
            slugs[slug] = await _register(internal, slug, template, deployment.platform.factory,
                                          instance)
    async with client(served.running) as http:
        assert _error(await http.get("/tokens/nope/onchain")) == (404, "not_found")
        dpnm_body = await _until_indexed(
            http, f"/tokens/{slugs['flowa']}/onchain",
            lambda body: body["lifetimeGwtMinted"] != "0")
        curve = await _until_indexed(http, f"/tokens/{slugs['agent-one']}/onchain",
                                     lambda body: True)
        graduated = await _until_indexed(http, f"/tokens/{slugs['agent-two']}/onchain",
                                         lambda body: True)
    async with open_chain(world.anvils[0].url) as chain:
        dpnm = dpnm_of(chain, deployment.platform, deployment.dpnm)
        block = dpnm_body["blockNumber"]
        root = dpnm.root.address
        assert dpnm_body == {
            "template": "dpnm", "slug": slugs["flowa"], "chainId": CHAIN_IDS[0],
            "blockNumber": block,
            "indexedBlock": dpnm_body["indexedBlock"],
            "instance": deployment.dpnm.instance.lower(),
            "flowProtocol": deployment.dpnm.protocol.lower(),
            "currentPrice": _amount(await dpnm.protocol.call("priceFLOW", block=block)),
            "poolUsdt": _amount(await dpnm.protocol.call("poolUSDT", block=block)),
            "totalSupply": _amount(await dpnm.flow.call("totalSupply", block=block)),
            "totalActivePositions": 2,  # the root and the user extended their tree
            "totalTreePositions": await dpnm.tree.call("getSubtreeSize", root) + 1,
            "lifetimeFeesUsdt": _amount(world.fees),
            "lifetimeGwtMinted": _amount(world.gwt_claimed)}
        await _check_curve(chain, deployment, curve, slugs["agent-one"])
        bonding = chain.contract("Bonding", deployment.platform.bonding)
        info = await bonding.call("tokenInfo", world.graduated.token,
                                  block=graduated["blockNumber"])
        reserves = await chain.contract("FPair", world.graduated.pair).call(
            "getReserves", block=graduated["blockNumber"])
        assert (info[11], info[12]) == (False, True) and int(info[3], 16) != 0
        assert {key: graduated[key] for key in ("graduated", "trading", "tradingOnUniswap",
                                                "agentToken", "pair", "reserves")} == {
            "graduated": True, "trading": False, "tradingOnUniswap": True,
            "agentToken": info[3].lower(), "pair": world.graduated.pair.lower(),
            "reserves": {"token": _amount(reserves[0]), "asset": _amount(reserves[1])}}


async def _register(internal: httpx.AsyncClient, slug: str, template: str, owner: str,
                    instance: str) -> str:
    """Register ``instance`` as ``slug``; return the token's slug. The indexer registers a
    factory launch itself once it is final (``docs/chain.md``): when it got there first (a
    fast indexer on a fresh database), the instance is taken (409) under its own slug."""
    registered = await internal.put(f"/internal/tokens/{slug}", headers=INTERNAL, json={
        "ownerAddress": owner, "template": template, "chainId": CHAIN_IDS[0],
        "instance": instance})
    if registered.status_code == 409:
        assert registered.json()["error"]["code"] == "conflict", registered.text
        return token_slug(template, CHAIN_IDS[0], instance)
    assert registered.status_code == 201, registered.text
    return slug


async def _check_curve(chain: Chain, deployment: Deployment, body: dict[str, Any],
                       slug: str) -> None:
    virtuals: Virtuals = virtuals_of(chain, deployment.platform, deployment.virtuals)
    block = body["blockNumber"]
    token_reserve, asset_reserve = await virtuals.pair.call("getReserves", block=block)
    supply = await virtuals.token.call("totalSupply", block=block)
    info = await virtuals.bonding.call("tokenInfo", virtuals.token.address, block=block)
    assert asset_reserve > 6_000 * UNIT  # the trade moved the curve since launch
    assert body == {
        "template": "virtuals", "slug": slug, "chainId": CHAIN_IDS[0],
        "blockNumber": block, "instance": virtuals.token.address.lower(),
        "bonding": virtuals.bonding.address.lower(), "pair": virtuals.pair.address.lower(),
        "name": "Agent One", "ticker": "AONE", "graduated": False, "trading": True,
        "tradingOnUniswap": False, "agentToken": None, "totalSupply": _amount(supply),
        "reserves": {"token": _amount(token_reserve), "asset": _amount(asset_reserve)},
        "gradThreshold": _amount(await virtuals.bonding.call("gradThreshold")),
        "price": _amount(asset_reserve * UNIT // token_reserve),
        "marketCap": _amount(asset_reserve * supply // token_reserve),
        "lastUpdated": info[4][11]}
    assert body["price"] != _amount(info[4][5])  # the stored price is stale


async def test_callers_without_an_address_and_removed_endpoints(served: Served) -> None:
    async with client(served.running) as anonymous:
        for path in ("/me/flow-onchain", "/me/tree"):
            assert _error(await anonymous.get(path)) == (401, "unauthenticated")
        for method, path in (("GET", "/me/flow-balance"), ("GET", "/me/payouts"),
                             ("POST", "/me/payouts"), ("GET", "/me/payouts/42")):
            gone = await anonymous.request(method, path)
            assert _error(gone) == (410, "endpoint_removed"), path
            assert "flow-onchain" in gone.json()["error"]["message"]
        document = (await anonymous.get("/openapi.json")).json()
        for path, status in (("/me/flow-onchain", "503"), ("/me/tree", "404"),
                             ("/tokens/{slug}/onchain", "503"), ("/me/flow-balance", "410")):
            assert status in document["paths"][path]["get"]["responses"], path
        assert {"FlowChain", "MissingChain", "TreePosition", "DirectView", "DpnmOnchain",
                "VirtualsOnchain"} <= set(document["components"]["schemas"])
    [code] = await served.running.service.db.write(new_access_codes, 1)
    async with client(served.running) as http:
        assert (await http.post("/auth/access-code", json={"code": code})).status_code == 200
        for path in ("/me/flow-onchain", "/me/tree"):
            assert _error(await http.get(path)) == (409, "address_required")


async def test_a_chain_down_is_named_and_all_down_is_503(served: Served, world: World) -> None:
    async with client(served.running) as http:
        await sign_in(http, _user(world))
        await served.proxies[1].set_down(True)
        response = await http.get("/me/flow-onchain")
        assert response.status_code == 200, response.text
        body = response.json()
        assert [entry["chainId"] for entry in body["chains"]] == [CHAIN_IDS[0]]
        [missing] = body["unavailable"]
        assert (missing["chainId"], missing["chainName"], missing["code"]) == (
            CHAIN_IDS[1], NAMES[1], "chain_unavailable")
        assert _error(await http.get("/me/flow-onchain", params={"chainId": CHAIN_IDS[1]})
                      ) == (503, "chain_unavailable")
        await served.proxies[0].set_down(True)
        served.running.service.state(ONCHAIN).cache_seconds = 0.0
        for path in ("/me/flow-onchain", "/me/tree"):
            assert _error(await http.get(path)) == (503, "chain_unavailable")
