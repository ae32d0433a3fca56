"""What users do on the reference contracts, and what tests do to the chain itself.

User actions send from the user's own key, as a wallet would (flowsvc itself never signs).
Chain actions use anvil's test methods: time travel (``evm_increaseTime``,
``evm_setNextBlockTimestamp``, ``anvil_mine``) and reorgs (``evm_snapshot`` then
``evm_revert`` and new blocks: the reverted heights get new hashes on the same parent).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import trio
from eth_account.signers.local import LocalAccount

from tests.support.chain.contracts import Contract, Receipt
from tests.support.chain.deploy import Dpnm, Virtuals
from tests.support.chain.rpc import Rpc

MAX_UINT = 2**256 - 1
USER_STATE_FIELDS = ("activated", "incomeLimit", "lifetimeLimit", "dayStart", "boughtToday",
                     "refillCredit", "refillResetAt", "activeUntil", "gwtPending")

# ---- FLOW protocol (dpnm)


async def fund_usdt(dpnm: Dpnm, user: LocalAccount, amount: int) -> None:
    """Mint ``amount`` test USDT to ``user`` (its mint is open) and approve the protocol."""
    await dpnm.usdt.transact(user, "mint", user.address, amount)
    await approve(dpnm.usdt, user, dpnm.protocol.address)


async def approve(token: Contract, owner: LocalAccount, spender: str, amount: int = MAX_UINT
                  ) -> Receipt:
    return await token.transact(owner, "approve", spender, amount)


async def activate(dpnm: Dpnm, user: LocalAccount, referrer: str) -> Receipt:
    return await dpnm.protocol.transact(user, "activate", referrer)


async def buy(dpnm: Dpnm, user: LocalAccount, usdt_amount: int) -> Receipt:
    return await dpnm.protocol.transact(user, "buy", usdt_amount)


async def sell(dpnm: Dpnm, user: LocalAccount, flow_amount: int) -> Receipt:
    return await dpnm.protocol.transact(user, "sell", flow_amount)


async def extend_tree(dpnm: Dpnm, user: LocalAccount, months: int) -> Receipt:
    return await dpnm.protocol.transact(user, "extendTree", months)


async def claim_gwt(dpnm: Dpnm, user: LocalAccount) -> Receipt:
    return await dpnm.protocol.transact(user, "claimGWT")


async def buy_income_limit_with_gwt(dpnm: Dpnm, user: LocalAccount, gwt_amount: int
                                    ) -> Receipt:
    return await dpnm.protocol.transact(user, "buyIncomeLimitWithGWT", gwt_amount)


async def join(dpnm: Dpnm, referrer: str, *, usdt: int = 0, months: int = 0) -> LocalAccount:
    """A new user funded with ``usdt`` (approved to the protocol) and activated under
    ``referrer``; with ``months``, its tree activity is extended (paid from ``usdt``)."""
    user = await dpnm.protocol.chain.new_account()
    if usdt:
        await fund_usdt(dpnm, user, usdt)
    await activate(dpnm, user, referrer)
    if months:
        await extend_tree(dpnm, user, months)
    return user


async def user_state(dpnm: Dpnm, user: str) -> dict[str, Any]:
    """``userState(user)`` by the field names of the interface."""
    return dict(zip(USER_STATE_FIELDS, await dpnm.protocol.call("userState", user),
                    strict=True))


# ---- bonding curve (virtuals)


async def fund_asset(virtuals: Virtuals, user: LocalAccount, amount: int) -> None:
    """Mint ``amount`` of the bonding asset to ``user`` (its mint is open), approve the router."""
    await virtuals.asset.transact(user, "mint", user.address, amount)
    await approve(virtuals.asset, user, virtuals.router.address)


async def bonding_buy(virtuals: Virtuals, user: LocalAccount, asset_amount: int) -> Receipt:
    """Buy the token for ``asset_amount`` of the asset (see ``fund_asset``)."""
    return await virtuals.bonding.transact(user, "buy", asset_amount, virtuals.token.address)


async def bonding_sell(virtuals: Virtuals, user: LocalAccount, token_amount: int) -> Receipt:
    """Approve the router for the token and sell ``token_amount`` of it."""
    await approve(virtuals.token, user, virtuals.router.address)
    return await virtuals.bonding.transact(user, "sell", token_amount, virtuals.token.address)


# ---- the chain itself


async def latest_block(rpc: Rpc) -> dict[str, Any]:
    block: dict[str, Any] = await rpc.call("eth_getBlockByNumber", "latest", False)
    return block


async def mine(rpc: Rpc, blocks: int = 1) -> None:
    await rpc.call("anvil_mine", hex(blocks))


async def wait_for_block(rpc: Rpc, number: int, timeout: float = 30.0) -> None:
    """Poll until the head reaches ``number`` (with ``--block-time``, blocks come by themselves).

    :raises trio.TooSlowError: not within ``timeout`` seconds.
    """
    with trio.fail_after(timeout):
        while True:
            if int(await rpc.call("eth_blockNumber"), 16) >= number:
                return
            await trio.sleep(0.1)


async def increase_time(rpc: Rpc, seconds: int) -> int:
    """Move the clock ``seconds`` ahead and mine a block there; return its timestamp."""
    await rpc.call("evm_increaseTime", hex(seconds))
    await mine(rpc)
    return int((await latest_block(rpc))["timestamp"], 16)


async def set_next_timestamp(rpc: Rpc, timestamp: int) -> None:
    """The next block (mined or made by a transaction) gets ``timestamp``."""
    await rpc.call("evm_setNextBlockTimestamp", hex(timestamp))


@dataclass(frozen=True)
class Snapshot:
    """An anvil snapshot and the head it was taken at."""

    id: str
    number: int


async def snapshot(rpc: Rpc) -> Snapshot:
    """A point to ``revert`` to (anvil drops it, and later ones, on that revert)."""
    snapshot_id: str = await rpc.call("evm_snapshot")
    return Snapshot(snapshot_id, int(await rpc.call("eth_blockNumber"), 16))


async def revert(rpc: Rpc, point: Snapshot) -> None:
    """Go back to the state and head of ``point``.

    :raises RuntimeError: anvil does not know the snapshot.
    """
    if not await rpc.call("evm_revert", point.id):
        raise RuntimeError(f"anvil has no snapshot {point.id}")


@dataclass(frozen=True)
class Reorg:
    """The hashes of heights ``fork + 1`` .. ``fork + len(old)``, before and after."""

    fork: int
    old: list[str]
    new: list[str]


async def reorg(rpc: Rpc, point: Snapshot) -> Reorg:
    """Replace every block mined since ``point`` by as many new empty blocks.

    The new blocks start one second after the old head: an empty block with the same parent
    and timestamp as the one it replaces could hash the same.
    """
    head = await latest_block(rpc)
    heights = range(point.number + 1, int(head["number"], 16) + 1)
    old = await _hashes(rpc, heights)
    await revert(rpc, point)
    if heights:
        await set_next_timestamp(rpc, int(head["timestamp"], 16) + 1)
        await mine(rpc, len(heights))
    return Reorg(point.number, old, await _hashes(rpc, heights))


async def _hashes(rpc: Rpc, heights: range) -> list[str]:
    blocks = await rpc.batch([("eth_getBlockByNumber", [hex(number), False])
                              for number in heights]) if heights else []
    return [block["hash"] for block in blocks]
