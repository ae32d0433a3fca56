"""The chain indexer against two anvil chains with different ids: what users do on the
reference contracts (activate, buy, sell, extend, claim) ends up in the indexed counters
exactly as the contracts' own logs say; launched tokens join the registry; a final ``Sold``
of a signed-in user emits ``payout.sent`` once; FLOW balance alerts."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
import trio
from sqlalchemy import select

from plugins.chain.indexed import earned_by_level, token_counters
from plugins.chain.tables import tokens
from tests.support.billing import billing_stack, subscription, until_subscription
from tests.support.chain.actions import (
    buy,
    claim_gwt,
    extend_tree,
    join,
    latest_block,
    mine,
    sell,
)
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain, open_chain
from tests.support.chain.deploy import Deployment, launch_dpnm
from tests.support.chain.indexing import (
    deployed_anvil,
    expected_of,
    head_number,
    indexing,
    until_final,
    until_indexed,
)
from tests.support.chain.service import chain_entry, chains_env
from tests.support.projects import eventually
from tests.support.server import client
from tests.support.wallet import sign_in

UNIT = 10**18
OTHER_CHAIN_ID = 4242


@pytest.fixture(scope="module")
def other() -> Iterator[tuple[Anvil, Deployment]]:
    """A second chain, with another id."""
    with deployed_anvil(OTHER_CHAIN_ID) as pair:
        yield pair


async def test_two_chains_are_indexed_as_their_contracts_say(
        tmp_path: Path, anvil: Anvil, deployment: Deployment,
        other: tuple[Anvil, Deployment], chain: Chain) -> None:
    other_anvil, other_deployment = other
    dpnm = await launch_dpnm(chain, deployment.platform)
    root = dpnm.root.address
    first = await join(dpnm, root, usdt=1_000 * UNIT, months=1)
    second = await join(dpnm, first.address, usdt=1_000 * UNIT, months=2)
    third = await join(dpnm, second.address, usdt=500 * UNIT)
    async with open_chain(other_anvil.url) as other_chain:
        other_dpnm = await launch_dpnm(other_chain, other_deployment.platform)
        other_user = await join(other_dpnm, other_dpnm.root.address, usdt=100 * UNIT)
        await buy(other_dpnm, other_user, 40 * UNIT)
        entries = [chain_entry(deployment.platform, [anvil.url], instance=dpnm.instance.address),
                   chain_entry(other_deployment.platform, [other_anvil.url],
                               instance=other_dpnm.instance.address)]
        async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                            entries) as (running, events), client(running) as http:
            service = running.service
            await sign_in(http, third)  # the seller is a user: their Sold is a payout
            await buy(dpnm, third, 50 * UNIT)
            await buy(dpnm, second, 50 * UNIT)
            await extend_tree(dpnm, third, 1)
            await claim_gwt(dpnm, first)
            sold = await sell(dpnm, third, await dpnm.flow.call("balanceOf", third.address) // 3)
            last = await head_number(chain.rpc)
            await mine(chain.rpc, 2)  # finality_depth 2: everything above is final now
            await mine(other_chain.rpc, 2)
            await until_final(service, chain.chain_id, last)
            await until_final(service, OTHER_CHAIN_ID, await head_number(other_chain.rpc) - 2)

            expected = await expected_of(dpnm, last)
            counters = await service.db.read(token_counters, chain.chain_id,
                                             dpnm.instance.address)
            assert counters.total_tree_positions == expected.tree_positions == 4
            assert counters.lifetime_fees_usdt == expected.fees_usdt == 20 * UNIT
            assert counters.lifetime_gwt_minted == expected.gwt_minted > 0
            active = [user for user in (root, first.address, second.address, third.address)
                      if await dpnm.tree.call("isActive", user)]
            assert counters.total_active_positions == len(active) == 3
            for user in (root, first.address, second.address, third.address):
                assert await service.db.read(earned_by_level, chain.chain_id,
                                             dpnm.instance.address, user) == \
                    expected.earned.get(user.lower(), [0] * 10)
            assert sum(expected.earned[first.address.lower()]) > 0

            # The other chain keeps its own counters, by its own id.
            other_counters = await service.db.read(token_counters, OTHER_CHAIN_ID,
                                                   other_dpnm.instance.address)
            assert other_counters.total_tree_positions == 2
            assert other_counters.lifetime_fees_usdt == 8 * UNIT
            assert (await service.db.read(token_counters, OTHER_CHAIN_ID,
                                          dpnm.instance.address)).total_tree_positions == 0

            # Launched tokens are in the registry under the documented slug.
            registered = await service.db.read(lambda connection: connection.execute(
                select(tokens.c.slug, tokens.c.template, tokens.c.owner_address)
                .where(tokens.c.instance_address == dpnm.instance.address.lower())).all())
            assert [tuple(row) for row in registered] == [
                (f"dpnm-{chain.chain_id}-{dpnm.instance.address.lower()[2:]}", "dpnm",
                 chain.deployer.address.lower())]

            # The sell of a signed-in user is one payout.sent, exact to 6 decimals.
            [payout] = [event for event in events.events if event.name == "payout.sent"]
            [sold_event] = dpnm.protocol.events(sold, "Sold")
            assert payout.data["payout_id"] == \
                f"{chain.chain_id}:{sold.tx_hash.lower()}:{sold_event.log_index}"
            assert payout.data["tx_hash"] == sold.tx_hash.lower()
            assert payout.data["amount_flow_wei"] == str(sold_event["flowIn"])
            assert payout.data["amount_usdt"] == _six_decimals(sold_event["usdtOut"])

            ready = (await http.get("/readyz")).json()["checks"]["chain_indexers"]
            assert ready["ok"] is True
            assert {name: chain["state"] for name, chain in ready["chains"].items()} == \
                {f"chain{chain.chain_id}": "indexing", f"chain{OTHER_CHAIN_ID}": "indexing"}
            metrics = (await http.get("/metrics")).text
            assert f'flowsvc_chain_indexed_block{{chain="chain{OTHER_CHAIN_ID}"}}' in metrics
            assert 'flowsvc_chain_rpc_requests_total{chain="chain31337"' in metrics


async def test_flow_balance_alerts(tmp_path: Path, anvil: Anvil, deployment: Deployment,
                                   chain: Chain) -> None:
    dpnm = await launch_dpnm(chain, deployment.platform)
    user = await join(dpnm, dpnm.root.address, usdt=1_000 * UNIT)
    entries = [chain_entry(deployment.platform, [anvil.url], instance=dpnm.instance.address)]
    async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                        entries) as (running, events), client(running) as http:
        assert (await http.get("/me/alerts/flow-balance")).status_code == 401
        _, account = await sign_in(http, user)
        assert (await http.get("/me/alerts/flow-balance")).json() == {"threshold": None}
        for body, code in (({"threshold": 5}, "invalid_request"),
                           ({"threshold": "1.0000001"}, "invalid_request"),
                           ({"threshold": "-1"}, "invalid_request"),
                           ({}, "invalid_request")):
            refused = await http.put("/me/alerts/flow-balance", json=body)
            assert (refused.status_code, refused.json()["error"]["code"]) == (400, code), body
        put = await http.put("/me/alerts/flow-balance", json={"threshold": "30"})
        assert put.json() == {"threshold": "30.000000"}
        assert (await http.get("/me/alerts/flow-balance")).json() == {"threshold": "30.000000"}

        await buy(dpnm, user, 50 * UNIT)  # 40 FLOW: above a threshold of 30
        await sell(dpnm, user, 5 * UNIT)  # 35: still above
        await sell(dpnm, user, 10 * UNIT)  # 25: crosses below, once
        await sell(dpnm, user, 5 * UNIT)  # 20: still below, nothing new
        await mine(chain.rpc, 3)
        await until_final(service := running.service, chain.chain_id,
                          await head_number(chain.rpc) - 2)

        def lows() -> list[dict[str, object]]:
            return [dict(event.data) for event in events.events
                    if event.name == "flow.balance.low"]

        await eventually(lambda: _true(bool(lows())))
        [low] = lows()
        assert low["threshold"] == "30.000000" and low["chain_id"] == chain.chain_id
        assert low["balance"] in ("25.000000", "20.000000")  # read at the last final block
        assert [event.user_id for event in events.events
                if event.name == "flow.balance.low"] == [int(str(account["id"]))]
        assert (await http.put("/me/alerts/flow-balance",
                               json={"threshold": None})).json() == {"threshold": None}
        assert service is running.service


async def _true(value: bool) -> bool:
    return value


def _six_decimals(wei: int) -> str:
    micro = wei // 10**12
    return f"{micro // 10**6}.{micro % 10**6:06d}"


async def test_a_usdt_payment_end_to_end(tmp_path: Path, anvil: Anvil, deployment: Deployment,
                                         chain: Chain) -> None:
    """Billing's ``usdt_bep20`` checkout, paid by a USDT transfer on anvil: the subscription
    is active once the transfer is final, and not before."""
    platform = deployment.platform
    treasury = "0x" + "7e" * 20
    extra = {"FLOWSVC_PLUGINS_BILLING_USDT_TOKEN": platform.usdt.lower(),
             "FLOWSVC_PLUGINS_BILLING_USDT_TREASURY": treasury,
             "FLOWSVC_PLUGINS_BILLING_USDT_CHAIN_ID": str(platform.chain_id),
             **chains_env([chain_entry(platform, [anvil.url], finality_depth=3,
                                       instance=deployment.dpnm.instance)])}
    async with billing_stack(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                             extra=extra) as stack, client(stack.running) as http:
        wallet = await chain.new_account()
        await sign_in(http, wallet)
        started = await http.post("/subscriptions/checkout",
                                  json={"tier": "plus", "provider": "usdt_bep20"})
        assert started.status_code == 201, started.text
        amount = int(Decimal(started.json()["payment"]["amount"]) * UNIT)
        usdt = chain.contract("Token", platform.usdt)
        await usdt.transact(wallet, "mint", wallet.address, amount)
        await usdt.transact(wallet, "transfer", treasury, amount)
        await mine(chain.rpc, 2)  # not final yet at a depth of 3
        await trio.sleep(0.5)
        assert (await subscription(http))["status"] != "active"
        await mine(chain.rpc, 1)
        active = await until_subscription(http, status="active", tier="plus")
        assert active["provider"] == "usdt_bep20"
        [received] = stack.named("payment.received")
        assert received["outcome"] == "granted"


async def test_a_payment_counted_at_the_tip_is_credited_after_a_stop(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    """The payment's block is indexed at the tip (not final yet) and the service stops; the
    node moves far past it meanwhile: the restarted indexer catches up by history ranges and
    still runs that block's final work, so the payment is credited."""
    platform = deployment.platform
    treasury = "0x" + "7f" * 20
    extra = {"FLOWSVC_PLUGINS_BILLING_USDT_TOKEN": platform.usdt.lower(),
             "FLOWSVC_PLUGINS_BILLING_USDT_TREASURY": treasury,
             "FLOWSVC_PLUGINS_BILLING_USDT_CHAIN_ID": str(platform.chain_id),
             **chains_env([chain_entry(platform, [anvil.url], finality_depth=3,
                                       instance=deployment.dpnm.instance)])}
    database = f"sqlite:///{tmp_path / 'db.sqlite'}"
    wallet = await chain.new_account()
    async with billing_stack(tmp_path / "var", database, extra=extra) as stack, \
            client(stack.running) as http:
        await sign_in(http, wallet)
        started = await http.post("/subscriptions/checkout",
                                  json={"tier": "plus", "provider": "usdt_bep20"})
        assert started.status_code == 201, started.text
        amount = int(Decimal(started.json()["payment"]["amount"]) * UNIT)
        usdt = chain.contract("Token", platform.usdt)
        await usdt.transact(wallet, "mint", wallet.address, amount)
        await usdt.transact(wallet, "transfer", treasury, amount)
        top = await latest_block(chain.rpc)
        await until_indexed(stack.running.service, chain.chain_id, int(top["number"], 16),
                            top["hash"])
        assert (await subscription(http))["status"] != "active"
    await mine(chain.rpc, 3 + 10)  # while the service is down
    async with billing_stack(tmp_path / "var", database, extra=extra) as stack, \
            client(stack.running) as http:
        await sign_in(http, wallet)
        active = await until_subscription(http, status="active", tier="plus")
        assert active["provider"] == "usdt_bep20"
