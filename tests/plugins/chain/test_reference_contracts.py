"""The reference contracts on a real anvil follow the rules of chain.md and contracts/README.md.

Every test makes its own users (and usually its own dpnm instance), so the module's tests
share one anvil without sharing state; time travel only ever moves forward.
"""

from __future__ import annotations

import os

import pytest
from eth_abi import abi as codec
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from tests.support.chain.actions import (
    bonding_buy,
    bonding_sell,
    buy,
    buy_income_limit_with_gwt,
    claim_gwt,
    extend_tree,
    fund_asset,
    increase_time,
    join,
    latest_block,
    reorg,
    sell,
    set_next_timestamp,
    snapshot,
    user_state,
)
from tests.support.chain.contracts import Chain, Reverted, artifact
from tests.support.chain.deploy import (
    BONDING_GRAD_THRESHOLD,
    BONDING_SUPPLY,
    BONDING_VIRTUAL_LIQUIDITY,
    DPNM,
    INITIAL_PRICE,
    MULTICALL3,
    UNIT,
    VIRTUALS,
    ZERO_ADDRESS,
    Deployment,
    Dpnm,
    launch_virtuals,
)

DAY = 86_400


async def test_buy_has_a_minimum_a_20_percent_fee_and_doubles_into_the_income_limit(
        dpnm: Dpnm) -> None:
    user = await join(dpnm, dpnm.root.address, usdt=100 * UNIT)
    assert await dpnm.protocol.call("priceFLOW") == INITIAL_PRICE
    with pytest.raises(Reverted) as below:
        await buy(dpnm, user, 20 * UNIT - 1)
    assert below.value.error == "BelowMinimumBuy"

    receipt = await buy(dpnm, user, 20 * UNIT)

    # 80% buys FLOW at the initial price; of the 4 USDT fee, 5% of the gross (1 USDT) goes to
    # the treasury and the rest stays in the pool (the root has no tree activity: no reward).
    [bought] = dpnm.protocol.events(receipt, "Bought")
    price = 19 * UNIT * UNIT // (16 * UNIT)
    assert bought.args == {"user": user.address, "usdtIn": 20 * UNIT, "flowOut": 16 * UNIT,
                           "priceAfter": price, "incomeLimitAfter": 40 * UNIT}
    assert dpnm.protocol.events(receipt, "RewardPaid") == []
    assert await dpnm.usdt.call("balanceOf", dpnm.treasury) == UNIT
    assert await dpnm.protocol.call("poolUSDT") == 19 * UNIT
    assert await dpnm.usdt.call("balanceOf", dpnm.protocol.address) == 19 * UNIT
    assert await dpnm.flow.call("balanceOf", user.address) == 16 * UNIT
    assert await dpnm.protocol.call("priceFLOW") == price
    assert await dpnm.protocol.call("incomeLimit", user.address) == 40 * UNIT
    assert await dpnm.protocol.call("lifetimeIncomeLimit", user.address) == 40 * UNIT

    stranger = await dpnm.protocol.chain.new_account()
    with pytest.raises(Reverted) as inactive:
        await buy(dpnm, stranger, 20 * UNIT)
    assert inactive.value.error == "NotActivated"


async def test_daily_limit_resets_each_24_hours_and_sells_give_a_48_hour_credit(
        chain: Chain, dpnm: Dpnm) -> None:
    user = await join(dpnm, dpnm.root.address, usdt=1_000 * UNIT)
    assert await dpnm.protocol.call("dailyLimitMax") == 50 * UNIT
    await buy(dpnm, user, 30 * UNIT)
    with pytest.raises(Reverted) as over:
        await buy(dpnm, user, 21 * UNIT)
    assert over.value.error == "DailyLimitExceeded"
    await buy(dpnm, user, 20 * UNIT)
    assert (await user_state(dpnm, user.address))["boughtToday"] == 50 * UNIT

    receipt = await sell(dpnm, user, 37 * UNIT)
    [sold] = dpnm.protocol.events(receipt, "Sold")
    credit = sold["usdtOut"]
    sold_at = int((await latest_block(chain.rpc))["timestamp"], 16)
    state = await user_state(dpnm, user.address)
    assert (state["refillCredit"], state["refillResetAt"]) == (credit, sold_at + 2 * DAY)

    # The window is spent: a buy now draws on the credit, and only up to it.
    with pytest.raises(Reverted) as beyond_credit:
        await buy(dpnm, user, credit + 1)
    assert beyond_credit.value.error == "DailyLimitExceeded"
    await buy(dpnm, user, 20 * UNIT)
    credit_left = credit - 20 * UNIT
    assert (await user_state(dpnm, user.address))["refillCredit"] == credit_left

    # Two days on: a new window of 50, and the credit has lapsed though still stored.
    await increase_time(chain.rpc, 2 * DAY)
    assert (await user_state(dpnm, user.address))["refillCredit"] == credit_left
    with pytest.raises(Reverted) as lapsed:
        await buy(dpnm, user, 50 * UNIT + 1)
    assert lapsed.value.error == "DailyLimitExceeded"
    await buy(dpnm, user, 50 * UNIT)
    state = await user_state(dpnm, user.address)
    bought_at = int((await latest_block(chain.rpc))["timestamp"], 16)
    assert (state["dayStart"], state["boughtToday"], state["refillCredit"]) == (
        bought_at, 50 * UNIT, 0)


async def test_daily_limit_is_a_thousandth_of_the_pool_above_50_usdt(
        chain: Chain, dpnm: Dpnm) -> None:
    # poolUSDT is the protocol's first storage slot (constants and immutables take none).
    await chain.rpc.call("anvil_setStorageAt", dpnm.protocol.address, "0x0",
                         "0x" + (120_000 * UNIT).to_bytes(32, "big").hex())
    assert await dpnm.protocol.call("poolUSDT") == 120_000 * UNIT
    assert await dpnm.protocol.call("dailyLimitMax") == 120 * UNIT


async def test_sells_are_capped_by_the_income_limit_and_reduce_it(dpnm: Dpnm) -> None:
    whale = await join(dpnm, dpnm.root.address, usdt=100 * UNIT)
    small = await join(dpnm, dpnm.root.address, usdt=100 * UNIT)
    await buy(dpnm, whale, 50 * UNIT)
    await buy(dpnm, small, 20 * UNIT)
    await dpnm.flow.transact(whale, "transfer", small.address, 40 * UNIT)
    holding = await dpnm.flow.call("balanceOf", small.address)
    price = await dpnm.protocol.call("priceFLOW")
    assert holding * price // UNIT > 40 * UNIT  # worth more than the 2 x 20 limit
    with pytest.raises(Reverted) as capped:
        await sell(dpnm, small, holding)
    assert capped.value.error == "IncomeLimitExceeded"

    usdt_before = await dpnm.usdt.call("balanceOf", small.address)
    supply_before = await dpnm.flow.call("totalSupply")
    receipt = await sell(dpnm, small, 30 * UNIT)

    usdt_out = 30 * UNIT * price // UNIT
    [sold] = dpnm.protocol.events(receipt, "Sold")
    assert sold.args == {"user": small.address, "flowIn": 30 * UNIT, "usdtOut": usdt_out,
                         "priceAfter": await dpnm.protocol.call("priceFLOW"),
                         "incomeLimitAfter": 40 * UNIT - usdt_out, "flowBurned": 30 * UNIT}
    assert await dpnm.protocol.call("incomeLimit", small.address) == 40 * UNIT - usdt_out
    assert await dpnm.protocol.call("lifetimeIncomeLimit", small.address) == 40 * UNIT
    assert await dpnm.usdt.call("balanceOf", small.address) == usdt_before + usdt_out
    assert await dpnm.flow.call("totalSupply") == supply_before - 30 * UNIT


async def test_extend_tree_sells_1_to_3_months_at_most_90_days_ahead(
        chain: Chain, dpnm: Dpnm) -> None:
    user = await join(dpnm, dpnm.root.address, usdt=100 * UNIT)
    assert not await dpnm.tree.call("isActive", user.address)
    for months in (0, 4):
        with pytest.raises(Reverted) as bad:
            await extend_tree(dpnm, user, months)
        assert bad.value.error == "BadMonths"

    receipt = await extend_tree(dpnm, user, 3)
    until = int((await latest_block(chain.rpc))["timestamp"], 16) + 90 * DAY
    [extended] = dpnm.protocol.events(receipt, "TreeExtended")
    assert extended.args == {"user": user.address, "months": 3, "activeUntil": until}
    [marked] = dpnm.tree.events(receipt, "ActiveUntilSet")
    assert marked.args == {"user": user.address, "activeUntil": until}
    assert await dpnm.usdt.call("balanceOf", dpnm.treasury) == 30 * UNIT
    assert await dpnm.tree.call("isActive", user.address)
    assert (await user_state(dpnm, user.address))["activeUntil"] == until
    with pytest.raises(Reverted) as too_far:
        await extend_tree(dpnm, user, 1)
    assert too_far.value.error == "TooFarAhead"

    # A month later, another month counts from the current expiry.
    await increase_time(chain.rpc, 31 * DAY)
    receipt = await extend_tree(dpnm, user, 1)
    assert dpnm.protocol.events(receipt, "TreeExtended")[0]["activeUntil"] == until + 30 * DAY
    await increase_time(chain.rpc, 90 * DAY)
    assert not await dpnm.tree.call("isActive", user.address)


async def test_tree_places_under_the_referrer_else_breadth_first_in_its_subtree(
        dpnm: Dpnm) -> None:
    root = dpnm.root.address
    a, b, c, d, e, f, g = [await join(dpnm, root) for _ in range(7)]
    h = await join(dpnm, c.address)
    i = await join(dpnm, a.address)

    async def children(user: str) -> list[str]:
        return [await dpnm.tree.call("getChild", user, slot) for slot in range(3)]

    assert await children(root) == [a.address, b.address, c.address]
    assert await children(a.address) == [d.address, e.address, f.address]
    assert await children(b.address) == [g.address, ZERO_ADDRESS, ZERO_ADDRESS]
    assert await children(c.address) == [h.address, ZERO_ADDRESS, ZERO_ADDRESS]
    assert await children(d.address) == [i.address, ZERO_ADDRESS, ZERO_ADDRESS]
    sizes = {root: 9, a.address: 4, b.address: 1, c.address: 1, d.address: 1, i.address: 0}
    for user, size in sizes.items():
        assert await dpnm.tree.call("getSubtreeSize", user) == size
    assert await dpnm.tree.call("getParent", i.address) == d.address
    assert await dpnm.tree.call("getDepth", i.address) == 3
    assert await dpnm.tree.call("root") == root
    with pytest.raises(Reverted) as no_slot:
        await dpnm.tree.call("getChild", root, 3)
    assert no_slot.value.error == "NoSuchSlot"

    # Events say who referred and where the user landed.
    chain = dpnm.protocol.chain
    j = await join(dpnm, a.address)
    latest = {"fromBlock": "latest", "toBlock": "latest"}
    tree_logs = await chain.rpc.call("eth_getLogs", {"address": dpnm.tree.address, **latest})
    assert [event.args for event in dpnm.tree.events(tree_logs, "UserPlaced")] == [
        {"user": j.address, "referrer": a.address, "parent": d.address, "depth": 3}]
    logs = await chain.rpc.call("eth_getLogs", {"address": dpnm.protocol.address, **latest})
    assert [event.args for event in dpnm.protocol.events(logs, "Activated")] == [
        {"user": j.address, "referrer": a.address, "depth": 3}]

    stranger = await chain.new_account()
    for account, referrer, error in ((j, root, "AlreadyActivated"),
                                     (stranger, stranger.address, "ReferrerNotActivated")):
        with pytest.raises(Reverted) as refused:
            await dpnm.protocol.transact(account, "activate", referrer)
        assert refused.value.error == error


async def test_fees_pay_active_ancestors_per_level_and_accrue_gwt_to_all_of_them(
        dpnm: Dpnm) -> None:
    # A line of 12 under the root; u12 buys. Levels 0..9 above it are u11..u2.
    active = {11, 10, 8, 2}  # levels 0, 1, 3 and 9
    line = [dpnm.root]
    for number in range(1, 12):
        line.append(await join(dpnm, line[-1].address, usdt=10 * UNIT if number in active else 0,
                               months=1 if number in active else 0))
    buyer = await join(dpnm, line[-1].address, usdt=50 * UNIT)

    receipt = await buy(dpnm, buyer, 50 * UNIT)

    paid = [(event["ancestor"], event["levelIndex"], event["amount"])
            for event in dpnm.protocol.events(receipt, "RewardPaid")]
    assert paid == [(line[11].address, 0, 50 * UNIT * 500 // 10_000),
                    (line[10].address, 1, 50 * UNIT * 300 // 10_000),
                    (line[8].address, 3, 50 * UNIT * 100 // 10_000),
                    (line[2].address, 9, 50 * UNIT * 50 // 10_000)]
    assert {event["payer"] for event in dpnm.protocol.events(receipt, "RewardPaid")} == {
        buyer.address}
    assert await dpnm.usdt.call("balanceOf", line[11].address) == 50 * UNIT * 500 // 10_000
    rewarded = sum(amount for _, _, amount in paid)
    assert await dpnm.protocol.call("poolUSDT") == 50 * UNIT - 50 * UNIT * 500 // 10_000 - rewarded

    # 10% of the 10 USDT fee, as GWT, to each of the ten ancestors, active or not.
    for number, user in enumerate(line):
        expected = UNIT if number >= 2 else 0
        assert await dpnm.protocol.call("pendingGWT", user.address) == expected, number
    assert await dpnm.protocol.call("pendingGWT", buyer.address) == 0

    receipt = await claim_gwt(dpnm, line[11])
    assert [event.args for event in dpnm.protocol.events(receipt, "GWTClaimed")] == [
        {"user": line[11].address, "amount": UNIT}]
    assert await dpnm.gwt.call("balanceOf", line[11].address) == UNIT
    assert (await user_state(dpnm, line[11].address))["gwtPending"] == 0
    with pytest.raises(Reverted) as nothing:
        await claim_gwt(dpnm, line[11])
    assert nothing.value.error == "NothingToClaim"

    receipt = await buy_income_limit_with_gwt(dpnm, line[11], 8 * UNIT // 10)
    [redeemed] = dpnm.protocol.events(receipt, "IncomeLimitBoughtWithGWT")
    assert redeemed.args == {"user": line[11].address, "gwtBurned": 8 * UNIT // 10,
                             "limitGained": UNIT}
    assert await dpnm.protocol.call("incomeLimit", line[11].address) == UNIT
    assert await dpnm.protocol.call("lifetimeIncomeLimit", line[11].address) == UNIT
    assert await dpnm.gwt.call("totalSupply") == 2 * UNIT // 10


def _create2(factory: str, salt: bytes, init_code: bytes) -> str:
    return to_checksum_address(keccak(b"\xff" + bytes.fromhex(factory[2:]) + salt
                                      + keccak(init_code))[12:])


async def test_factory_launches_by_template_id_and_announces_it(
        chain: Chain, deployment: Deployment) -> None:
    platform = deployment.platform
    factory = chain.contract("LaunchpadFactory", platform.factory)
    root, treasury, salt = await chain.new_account(), await chain.new_account(), os.urandom(32)
    params = codec.encode(["address", "address", "address", "uint256"],
                            [platform.usdt, treasury.address, root.address, 2 * UNIT])
    receipt = await factory.transact(chain.deployer, "launch", DPNM, params, salt)

    # An indexer finds launches by template id (an indexed topic) and decodes them.
    logs = await chain.rpc.call("eth_getLogs", {
        "address": factory.address, "blockHash": receipt.block_hash,
        "topics": [None, "0x" + DPNM.hex()]})
    [launched] = factory.events(logs, "Launched")
    init_code = (bytes.fromhex(artifact("DpnmInstance").bytecode[2:])
                 + codec.encode(["address", "address", "address", "uint256"],
                                  [platform.usdt, treasury.address, root.address, 2 * UNIT]))
    instance_address = _create2(factory.address, salt, init_code)
    assert launched.args == {"id": DPNM, "instance": instance_address,
                             "deployer": chain.deployer.address, "salt": salt, "params": params}

    instance = chain.contract("DpnmInstance", instance_address)
    flow, gwt, tree, protocol_address = await instance.call("ecosystem")
    protocol = chain.contract("FlowProtocol", protocol_address)
    assert [await protocol.call(name) for name in ("flow", "gwt", "tree", "usdt", "treasury")
            ] == [flow, gwt, tree, platform.usdt, treasury.address]
    assert await chain.contract("PhenomenalTree", tree).call("root") == root.address
    assert await protocol.call("priceFLOW") == 2 * UNIT
    assert await protocol.call("isActivated", root.address)
    for token, symbol in ((flow, "FLOW"), (gwt, "GWT")):
        assert [await chain.contract("Token", token).call(name)
                for name in ("symbol", "decimals", "totalSupply")] == [symbol, 18, 0]

    virtuals = await launch_virtuals(chain, platform, "Agent Two", "ATWO")
    [announced] = factory.events(await chain.rpc.call("eth_getLogs", {
        "address": factory.address, "fromBlock": "latest", "toBlock": "latest"}), "Launched")
    assert (announced["id"], announced["instance"]) == (VIRTUALS, virtuals.token.address)

    unknown = keccak(text="dpnm-v2")
    with pytest.raises(Reverted) as refused:
        await factory.transact(chain.deployer, "launch", unknown, params, os.urandom(32))
    assert (refused.value.error, refused.value.values) == ("UnknownTemplate", (unknown,))


async def test_bonding_curve_moves_reserves_keeps_stale_prices_and_graduates(
        chain: Chain, deployment: Deployment) -> None:
    virtuals = await launch_virtuals(chain, deployment.platform, "Agent Three", "ATHREE")
    info = await virtuals.bonding.call("tokenInfo", virtuals.token.address)
    creator, token, pair, agent_token, data, *_, trading, on_uniswap = info
    launch_price = BONDING_VIRTUAL_LIQUIDITY * UNIT // BONDING_SUPPLY
    assert (creator, token, pair, agent_token, trading, on_uniswap) == (
        chain.deployer.address, virtuals.token.address, virtuals.pair.address,
        ZERO_ADDRESS, True, False)
    assert data[:8] == (virtuals.token.address, "Agent Three", "Agent Three", "ATHREE",
                        BONDING_SUPPLY, launch_price, launch_price * BONDING_SUPPLY // UNIT,
                        BONDING_VIRTUAL_LIQUIDITY)
    assert await virtuals.pair.call("getReserves") == (BONDING_SUPPLY, BONDING_VIRTUAL_LIQUIDITY)

    trader = await chain.new_account()
    quote = await virtuals.router.call("getAmountsOut", virtuals.token.address,
                                       virtuals.asset.address, 1_000 * UNIT)
    assert quote == 1_000 * UNIT * BONDING_SUPPLY // (BONDING_VIRTUAL_LIQUIDITY + 1_000 * UNIT)
    await fund_asset(virtuals, trader, 50_000 * UNIT)
    later = int((await latest_block(chain.rpc))["timestamp"], 16) + 100
    await set_next_timestamp(chain.rpc, later)
    receipt = await bonding_buy(virtuals, trader, 1_000 * UNIT)
    assert [event.args for event in virtuals.pair.events(receipt, "Swap")] == [
        {"amount0In": 0, "amount0Out": quote, "amount1In": 1_000 * UNIT, "amount1Out": 0}]
    assert await virtuals.pair.call("getReserves") == (
        BONDING_SUPPLY - quote, BONDING_VIRTUAL_LIQUIDITY + 1_000 * UNIT)
    assert await virtuals.pair.call("balance") == BONDING_SUPPLY - quote
    assert await virtuals.pair.call("assetBalance") == 1_000 * UNIT
    assert await virtuals.token.call("balanceOf", trader.address) == quote
    asset_left = 49_000 * UNIT
    # Stale by design: the live price moved, the stored one did not; only lastUpdated did.
    stored = (await virtuals.bonding.call("tokenInfo", virtuals.token.address))[4]
    assert (stored[5], stored[11]) == (launch_price, later)

    tokens, assets = await virtuals.pair.call("getReserves")
    receipt = await bonding_sell(virtuals, trader, quote // 2)
    asset_out = quote // 2 * assets // (tokens + quote // 2)
    assert [event.args for event in virtuals.pair.events(receipt, "Swap")] == [
        {"amount0In": quote // 2, "amount0Out": 0, "amount1In": 0, "amount1Out": asset_out}]
    assert await virtuals.asset.call("balanceOf", trader.address) == asset_left + asset_out

    # Enough asset to bring the token reserve down to the threshold: it graduates.
    tokens, assets = await virtuals.pair.call("getReserves")
    needed = -(-assets * (tokens - BONDING_GRAD_THRESHOLD) // BONDING_GRAD_THRESHOLD)
    await fund_asset(virtuals, trader, needed)
    receipt = await bonding_buy(virtuals, trader, needed)
    assert (await virtuals.pair.call("getReserves"))[0] <= BONDING_GRAD_THRESHOLD
    [graduated] = virtuals.bonding.events(receipt, "Graduated")
    info = await virtuals.bonding.call("tokenInfo", virtuals.token.address)
    assert graduated.args == {"token": virtuals.token.address, "agentToken": info[3]}
    assert info[3] != ZERO_ADDRESS
    assert (info[-2], info[-1]) == (False, True)
    with pytest.raises(Reverted) as closed:
        await bonding_buy(virtuals, trader, 1_000 * UNIT)
    assert closed.value.error == "NotTrading"


def _bytes(data: str) -> bytes:
    return bytes.fromhex(data.removeprefix("0x"))


async def test_multicall3_at_the_canonical_address_aggregates_with_per_call_flags(
        chain: Chain, dpnm: Dpnm) -> None:
    multicall = chain.contract("Multicall3", MULTICALL3)
    assert await chain.rpc.call("eth_getCode", MULTICALL3, "latest") == artifact(
        "Multicall3").deployed_bytecode
    calls = [(dpnm.protocol.address, False, _bytes(dpnm.protocol.encode("priceFLOW"))),
             (dpnm.tree.address, True,
              _bytes(dpnm.tree.encode("getChild", dpnm.root.address, 3))),
             (dpnm.usdt.address, False, _bytes(dpnm.usdt.encode("decimals")))]
    data = multicall.encode("aggregate3", calls)
    assert data.startswith("0x82ad56cb")

    results = multicall.decode("aggregate3", await chain.call(MULTICALL3, data))

    assert [success for success, _ in results] == [True, False, True]
    assert dpnm.protocol.decode("priceFLOW", results[0][1]) == INITIAL_PRICE
    no_such_slot = keccak(text="NoSuchSlot()")[:4]
    assert results[1][1] == no_such_slot
    assert dpnm.usdt.decode("decimals", results[2][1]) == 18
    strict = [(target, False, call_data) for target, _, call_data in calls]
    with pytest.raises(Reverted) as failed:
        await multicall.call("aggregate3", strict)
    assert (failed.value.error, failed.value.values) == ("Error", ("Multicall3: call failed",))
    block = await latest_block(chain.rpc)
    assert await multicall.call("getBlockNumber") == int(block["number"], 16)
    assert await multicall.call("getCurrentBlockTimestamp") == int(block["timestamp"], 16)


async def test_a_reverted_snapshot_then_new_blocks_reorg_the_same_heights(
        chain: Chain, dpnm: Dpnm) -> None:
    user = await chain.new_account()
    point = await snapshot(chain.rpc)
    receipt = await dpnm.usdt.transact(user, "mint", user.address, 5 * UNIT)
    parent = (await chain.rpc.call("eth_getBlockByNumber", hex(point.number), False))["hash"]

    replaced = await reorg(chain.rpc, point)

    assert (replaced.fork, len(replaced.old), len(replaced.new)) == (point.number, 1, 1)
    assert replaced.old == [receipt.block_hash]
    assert replaced.new[0] != receipt.block_hash
    block = await chain.rpc.call("eth_getBlockByNumber", hex(point.number + 1), False)
    assert (block["hash"], block["parentHash"], block["transactions"]) == (
        replaced.new[0], parent, [])
    assert await chain.rpc.call("eth_getTransactionReceipt", receipt.tx_hash) is None
    assert await dpnm.usdt.call("balanceOf", user.address) == 0
