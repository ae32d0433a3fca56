"""The on-chain read endpoints (``docs/chain.md``, section Endpoints).

- ``GET /me/flow-onchain``: the caller's FLOW position on every configured chain where the
  address has activity (or on ``?chainId=``): one ``eth_call`` per chain (concurrent requests
  share one exchange per chain: ``coalescing``), chains in parallel, each under its own
  deadline; a chain that cannot be read is named in ``unavailable``.
- ``GET /me/tree``: the caller's tree position with ``depth`` levels walked.
- ``GET /tokens/<slug>/onchain``: a registered token's on-chain state (public).
- ``/me/flow-balance`` and ``/me/payouts`` (and below): 410 Gone, naming the replacement.

Views are module-level functions on ``blueprint``; they find the service with
``current_service()``, the chains with ``service.state(CHAIN)`` and the reads (with their
caches) with ``service.state(ONCHAIN)``.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import trio
from pydantic import RootModel
from quart import Blueprint, Response
from quart_schema import document_querystring, document_response, validate_querystring

from plugins.chain.abi import AbiDecodeError
from plugins.chain.indexed import (
    earned_by_level,
    indexed_head,
    token_counters,
    unreadable_reason,
)
from plugins.chain.onchain.errors import (
    AddressNotActivated,
    AddressRequired,
    ChainUnavailable,
    ChainUnsupported,
    EndpointRemoved,
    TokenNotIndexed,
    TokenUnreadable,
)
from plugins.chain.onchain.indexed_logs import bonding_of
from plugins.chain.onchain.models import (
    ChainQuery,
    DpnmOnchain,
    FlowOnchainResponse,
    TreeQuery,
    TreeResponse,
    VirtualsOnchain,
)
from plugins.chain.onchain.reads import Chain, ChainReads, FlowPosition
from plugins.chain.rpc_errors import RpcError, RpcUnavailable
from plugins.chain.settings import ChainConfig
from plugins.chain.state import CHAIN, ChainState
from plugins.chain.tokens import get_token
from runtime.context import caller_first, require_user
from runtime.errors import NotFound
from runtime.http import current_service, json_response
from runtime.service import Service, StateSlot
from runtime.wire import format_units

T = TypeVar("T")

log = logging.getLogger("flowsvc.chain.onchain")

blueprint = Blueprint("chain_onchain", __name__)

ONCHAIN: StateSlot[ChainReads] = StateSlot("chain.onchain", lambda service: ChainReads())


class TokenOnchainResponse(RootModel[DpnmOnchain | VirtualsOnchain]):
    """``dpnm`` or ``virtuals``, told apart by ``template``."""


# ---- choosing and reading chains


def _caller_address() -> str:
    principal = require_user()
    if principal.address is None:
        raise AddressRequired("this account has no EVM address (signed in by access code or "
                              "messenger): sign in with a wallet to read on-chain state")
    return principal.address


def _chains(state: ChainState, configs: Sequence[ChainConfig]) -> list[Chain]:
    now = trio.current_time()
    return [Chain(config.id, config.name, state.pools[config.id], config.multicall3,
                  config.usdt, config.flow_instance, now + config.rpc_timeout_seconds)
            for config in configs]


def _chosen(state: ChainState, chain_id: int | None) -> list[ChainConfig]:
    """The chains a request reads: ``chain_id``'s, or every configured one in config order.

    :raises ChainUnsupported: ``chain_id`` is not configured.
    :raises ChainUnavailable: no chain is configured at all.
    """
    if chain_id is not None:
        if chain_id not in state.chains:
            raise ChainUnsupported(f"chain {chain_id} is not configured here; configured: "
                                   f"{sorted(state.chains) or 'none'}")
        return [state.chains[chain_id]]
    if not state.chains:
        raise ChainUnavailable("no chain is configured on this service")
    return list(state.chains.values())


def _caller_on(chain_id: int | None) -> tuple[str, Service, ChainReads, list[Chain]]:
    """The caller's address, the service, its reads and the chains a request reads.
    Raises as ``_caller_address`` and ``_chosen``."""
    address = _caller_address()
    service = current_service()
    state = service.state(CHAIN)
    return address, service, service.state(ONCHAIN), _chains(state, _chosen(state, chain_id))


def _failure(chain: Chain, error: Exception) -> dict[str, Any]:
    """A chain that could not be read, as ``unavailable`` lists it. The message names no
    URL: the details (redacted) go to the log."""
    log.warning("chain %s could not be read: %s", chain.name, error)
    if isinstance(error, RpcUnavailable):
        reason = "no RPC URL answered in time"
    else:
        reason = "its answer was refused or not understood (Multicall3 or the instance?)"
    return {"chainId": chain.id, "chainName": chain.name, "code": ChainUnavailable.code,
            "message": f"chain {chain.name} could not be read: {reason}"}


async def _read_each(chains: Sequence[Chain], read: Callable[[Chain], Awaitable[T]]
                     ) -> tuple[dict[int, T], list[dict[str, Any]]]:
    """``read`` every chain in parallel: the answers by chain id, and the failures."""
    answers: dict[int, T] = {}
    failures: list[dict[str, Any]] = []

    async def one(chain: Chain) -> None:
        try:
            answers[chain.id] = await read(chain)
        except (RpcError, AbiDecodeError) as error:
            failures.append(_failure(chain, error))

    if len(chains) == 1:
        await one(chains[0])  # no task and nursery for a single chain
    else:
        # The first chain is read in this task: one task fewer per request.
        async with trio.open_nursery() as nursery:
            for chain in chains[1:]:
                nursery.start_soon(one, chain)
            await one(chains[0])
    failures.sort(key=lambda failure: failure["chainId"])
    return answers, failures


async def _read_one(chain: Chain, read: Callable[[Chain], Awaitable[T]]) -> T:
    """``read`` one chain. Raises ``ChainUnavailable`` when it cannot be read."""
    answers, failures = await _read_each([chain], read)
    if failures:
        raise ChainUnavailable(failures[0]["message"])
    return answers[chain.id]


# ---- GET /me/flow-onchain


def _flow_entry(chain: Chain, position: FlowPosition, earned: list[int],
                subtree: list[int]) -> dict[str, Any]:
    state = position.state
    return {
        "chainId": chain.id, "chainName": chain.name, "blockNumber": position.block,
        "flowBalance": format_units(position.flow_balance),
        "usdtBalance": format_units(position.usdt_balance),
        "gwtBalance": format_units(position.gwt_balance),
        "currentPrice": format_units(position.price),
        "dailyLimitTotal": format_units(position.daily_limit_max),
        "dailyLimitRemaining": format_units(position.daily_limit_remaining),
        "incomeLimitRemaining": format_units(state.income_limit),
        "lifetimeIncome": format_units(sum(earned)),
        "treeActiveUntil": state.active_until,
        "treeActiveDaysLeft": position.tree_active_days_left,
        "claimableGWT": format_units(state.gwt_pending),
        "tree": {"upline": position.upline, "directSlots": position.direct_slots,
                 "subtreeSize": position.subtree_size, "subtreeByLevel": subtree},
    }


@blueprint.get("/me/flow-onchain")
@caller_first(require_user)
@validate_querystring(ChainQuery)
@document_querystring(ChainQuery)
@document_response(FlowOnchainResponse, 200)
async def flow_onchain(query_args: ChainQuery) -> Response:
    """The caller's FLOW position on each chain where their address has activity."""
    address, service, reads, chains = _caller_on(query_args.chainId)
    positions, failures = await _read_each(
        chains, lambda chain: reads.flow_position(chain, address))
    if not positions:
        raise ChainUnavailable("; ".join(failure["message"] for failure in failures))
    if query_args.chainId is not None and not positions[query_args.chainId].state.activated:
        raise AddressNotActivated(f"{address} has not called activate() on chain "
                                  f"{query_args.chainId}")
    listed = [chain for chain in chains if chain.id in positions
              and (query_args.chainId is not None or positions[chain.id].has_activity)]
    indexed = await reads.figures.of(service.db, service.state(CHAIN).indexers,
                                     [(chain.id, chain.flow_instance) for chain in listed],
                                     address)
    return json_response({
        "address": address,
        "chains": [_flow_entry(chain, positions[chain.id], *indexed[chain.id])
                   for chain in listed],
        "unavailable": failures})


# ---- GET /me/tree


@blueprint.get("/me/tree")
@caller_first(require_user)
@validate_querystring(TreeQuery)
@document_querystring(TreeQuery)
@document_response(TreeResponse, 200)
async def tree(query_args: TreeQuery) -> Response:
    """The caller's tree: upline, subtree by level, earnings by level and direct slots."""
    address, service, reads, chains = _caller_on(query_args.chainId)
    chain = chains[0]
    walk = await _read_one(chain, lambda chain: reads.tree_walk(chain, address,
                                                                query_args.depth))
    if not walk.activated:
        raise AddressNotActivated(f"{address} has not called activate() on chain {chain.id}")
    earned = await service.db.read(earned_by_level, chain.id, chain.flow_instance, address)
    return json_response({
        "address": address, "chainId": chain.id, "blockNumber": walk.block,
        "depth": query_args.depth, "upline": walk.upline,
        "subtreeByLevel": walk.subtree_by_level,
        "lifetimeEarnedByLevel": [format_units(amount) for amount in earned],
        "directs": [None if direct is None else {"address": direct.address,
                                                 "active": direct.active,
                                                 "subtreeSize": direct.subtree_size}
                    for direct in walk.directs]})


# ---- GET /tokens/<slug>/onchain


@blueprint.get("/tokens/<slug>/onchain")
@document_response(TokenOnchainResponse, 200)
async def token_onchain(slug: str) -> Response:
    """A registered token's on-chain state: a dpnm token's pool and counters, or a
    bonding-curve token's live curve."""
    service = current_service()
    token = await service.db.read(get_token, slug)
    if token is None:
        raise NotFound(f"no token with slug {slug!r}")
    state = service.state(CHAIN)
    config = state.chains.get(token.chain_id)
    if config is None:  # not an outage (no retry will find the chain): a 400, not a 503
        raise ChainUnsupported(f"token {slug!r} lives on chain {token.chain_id}, which this "
                               "service does not configure")
    [chain] = _chains(state, [config])
    reads = service.state(ONCHAIN)
    base = {"slug": slug, "chainId": chain.id, "instance": token.instance_address}
    if token.template == "dpnm":
        unreadable, counters, head = await service.db.read(
            lambda connection: (unreadable_reason(connection, chain.id, token.instance_address),
                                token_counters(connection, chain.id, token.instance_address),
                                indexed_head(connection, chain.id)))
        if unreadable is not None:
            raise TokenUnreadable(f"token {slug!r} cannot be read on chain {chain.id}: "
                                  f"{unreadable}")
        dpnm = await _read_one(chain, lambda chain: reads.dpnm_state(
            chain, token.instance_address))
        return json_response({
            "template": "dpnm", **base, "blockNumber": dpnm.block,
            "indexedBlock": head.number if head is not None else None,
            "flowProtocol": dpnm.protocol, "currentPrice": format_units(dpnm.price),
            "poolUsdt": format_units(dpnm.pool_usdt),
            "totalSupply": format_units(dpnm.total_supply),
            "totalActivePositions": counters.total_active_positions,
            "totalTreePositions": counters.total_tree_positions,
            "lifetimeFeesUsdt": format_units(counters.lifetime_fees_usdt),
            "lifetimeGwtMinted": format_units(counters.lifetime_gwt_minted)})
    bonding = await service.db.read(bonding_of, chain.id, config.factory,
                                    token.instance_address)
    if bonding is None:
        raise TokenNotIndexed(f"the launch of token {slug!r} is not indexed yet")
    curve = await _read_one(chain, lambda chain: reads.bonding_state(
        chain, bonding, token.instance_address))
    info, reserves = curve.info, curve.reserves
    price = reserves.asset_reserve * 10**18 // reserves.token_reserve
    graduated = info.trading_on_uniswap or not info.trading
    return json_response({
        "template": "virtuals", **base, "blockNumber": curve.block, "bonding": bonding,
        "pair": info.pair.lower(), "name": info.data.name, "ticker": info.data.ticker,
        "graduated": graduated, "trading": info.trading,
        "tradingOnUniswap": info.trading_on_uniswap,
        "agentToken": info.agent_token.lower() if int(info.agent_token, 16) else None,
        "totalSupply": format_units(curve.total_supply),
        "reserves": {"token": format_units(reserves.token_reserve),
                     "asset": format_units(reserves.asset_reserve)},
        "gradThreshold": format_units(curve.grad_threshold),
        "price": format_units(price),
        "marketCap": format_units(
            reserves.asset_reserve * curve.total_supply // reserves.token_reserve),
        "lastUpdated": info.data.last_updated})


# ---- removed and deprecated endpoints


@blueprint.get("/me/flow-balance")
async def flow_balance() -> Response:
    """Removed: off-chain FLOW balances no longer exist."""
    raise EndpointRemoved("GET /me/flow-balance was removed: off-chain FLOW balances no "
                          "longer exist; read GET /me/flow-onchain")


@blueprint.route("/me/payouts", methods=["GET", "POST"])
@blueprint.route("/me/payouts/<path:rest>", methods=["GET", "POST"])
async def payouts(rest: str = "") -> Response:
    """Deprecated: withdrawal is an on-chain sell from the user's wallet."""
    raise EndpointRemoved("the /me/payouts endpoints are deprecated and no longer served: "
                          "withdraw by selling FLOW from your wallet (sell() on chain); "
                          "read balances with GET /me/flow-onchain and subscribe to the "
                          "payout.sent webhook for sells")
