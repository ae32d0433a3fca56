"""What the on-chain endpoints read from a chain, and the short cache of FLOW positions.

Every figure of one answer comes from Multicall3 batches (``multicall``): a FLOW position is
ONE ``eth_call`` at ``latest`` (the block it saw comes back with it); a tree walk adds one
JSON-RPC request per level, pinned to the first call's block. The addresses of a dpnm
instance's parts (``ecosystem()``) never change, so they are read once per process.
Amounts stay ints here; ``routes`` formats them.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import trio

from plugins.chain.indexed import LEVELS
from plugins.chain.onchain.coalescing import CallCoalescer
from plugins.chain.onchain.figures import IndexedFigures
from plugins.chain.onchain.multicall import MAX_CALLS_PER_AGGREGATE, Answers, Batch, send_all
from plugins.chain.rpc import RpcPool
from plugins.chain.views import (
    BALANCE_OF,
    DAILY_LIMIT_MAX,
    ECOSYSTEM,
    GET_CHILD,
    GET_PARENT,
    GET_RESERVES,
    GET_SUBTREE_SIZE,
    GRAD_THRESHOLD,
    IS_ACTIVE,
    POOL_USDT,
    PRICE_FLOW,
    TOKEN_INFO,
    TOTAL_SUPPLY,
    USER_STATE,
    Ecosystem,
    Reserves,
    TokenInfo,
    UserState,
)

K = TypeVar("K")
V = TypeVar("V")

ZERO_ADDRESS = "0x" + "00" * 20
SLOTS = 3  # direct slots of a tree node
DAY = 86_400
CACHE_SECONDS = 1.0
CACHE_ENTRIES = 10_000


def _address_or_none(address: str) -> str | None:
    return None if int(address, 16) == 0 else address.lower()


@dataclass(frozen=True)
class Chain:
    """A configured chain as one request reads it: every RPC request of the read shares
    ``deadline`` (an absolute time on Trio's clock), so each chain has its own."""

    id: int
    name: str
    pool: RpcPool
    multicall: str
    usdt: str
    flow_instance: str
    deadline: float


@dataclass(frozen=True)
class FlowPosition:
    """An address's FLOW position on one chain, as one block saw it (amounts in wei)."""

    block: int
    timestamp: int
    flow_balance: int
    usdt_balance: int
    gwt_balance: int
    price: int
    daily_limit_max: int
    state: UserState
    upline: str | None
    direct_slots: list[str | None]
    subtree_size: int

    @property
    def has_activity(self) -> bool:
        """Activated there, or holding FLOW or GWT (what makes a chain worth listing)."""
        return self.state.activated or self.flow_balance > 0 or self.gwt_balance > 0

    @property
    def daily_limit_remaining(self) -> int:
        """USDT the address may still buy now: what is left of the 24-hour window's
        allowance (the full allowance once the window is over) plus an unexpired sell credit,
        as the protocol's buy would spend them."""
        now = self.timestamp
        bought = self.state.bought_today if now < self.state.day_start + DAY else 0
        credit = self.state.refill_credit if now < self.state.refill_reset_at else 0
        return max(self.daily_limit_max - bought, 0) + credit

    @property
    def tree_active_days_left(self) -> int:
        """Whole days of tree activity left, rounded up (0 once expired or never bought)."""
        return max(math.ceil((self.state.active_until - self.timestamp) / DAY), 0)


@dataclass(frozen=True)
class Direct:
    """A direct slot's occupant."""

    address: str
    active: bool
    subtree_size: int


@dataclass(frozen=True)
class TreeWalk:
    """A user's place in the tree and their subtree counted level by level."""

    block: int
    activated: bool
    upline: str | None
    subtree_size: int
    subtree_by_level: list[int]
    directs: list[Direct | None]


@dataclass(frozen=True)
class DpnmState:
    """A dpnm instance's pool, price and FLOW supply at one block."""

    block: int
    protocol: str
    price: int
    pool_usdt: int
    total_supply: int


@dataclass(frozen=True)
class BondingState:
    """A bonding-curve token at one block: its launcher's record and its pair's reserves."""

    block: int
    info: TokenInfo
    reserves: Reserves
    total_supply: int
    grad_threshold: int


def flow_position_batch(multicall: str, usdt: str, parts: Ecosystem, address: str
                        ) -> tuple[Batch, Callable[[Answers], FlowPosition]]:
    """The one ``aggregate3`` batch of ``address``'s FLOW position in the dpnm instance made
    of ``parts``, and how to read a ``FlowPosition`` out of its answers."""
    batch = Batch(multicall)
    flow = batch.add(BALANCE_OF, parts.flow, address)
    usdt_balance = batch.add(BALANCE_OF, usdt, address)
    gwt = batch.add(BALANCE_OF, parts.gwt, address)
    price = batch.add(PRICE_FLOW, parts.protocol)
    daily = batch.add(DAILY_LIMIT_MAX, parts.protocol)
    state = batch.add(USER_STATE, parts.protocol, address)
    parent = batch.add(GET_PARENT, parts.tree, address)
    children = [batch.add(GET_CHILD, parts.tree, address, slot) for slot in range(SLOTS)]
    size = batch.add(GET_SUBTREE_SIZE, parts.tree, address)

    def position_of(answers: Answers) -> FlowPosition:
        return FlowPosition(
            block=answers.block, timestamp=answers.timestamp, flow_balance=flow.of(answers),
            usdt_balance=usdt_balance.of(answers), gwt_balance=gwt.of(answers),
            price=price.of(answers), daily_limit_max=daily.of(answers),
            state=state.of(answers), upline=_address_or_none(parent.of(answers)),
            direct_slots=[_address_or_none(child.of(answers)) for child in children],
            subtree_size=size.of(answers))

    return batch, position_of


def _keep(kept: OrderedDict[K, V], key: K, value: V) -> None:
    """Put ``value`` in the bounded cache ``kept``, dropping the least recently put."""
    kept[key] = value
    kept.move_to_end(key)
    while len(kept) > CACHE_ENTRIES:
        kept.popitem(last=False)


@dataclass
class _Cached:
    position: FlowPosition
    stored_at: float


@dataclass
class ChainReads:
    """The reads of every chain with their caches; one per service (``ONCHAIN`` slot).

    ``positions`` is the short cache keyed by (chain, block, address): an entry answers
    while it is younger than ``cache_seconds`` and no newer block of its chain is known (from
    another read, or from the pool's URLs, whose heads the indexer polls).
    """

    cache_seconds: float = CACHE_SECONDS
    ecosystems: dict[tuple[int, str], Ecosystem] = field(default_factory=dict)
    positions: OrderedDict[tuple[int, str], _Cached] = field(default_factory=OrderedDict)
    # The encoded batch of each recent address: encoding costs more than the call's answer.
    batches: OrderedDict[tuple[int, str], tuple[Batch, Callable[[Answers], FlowPosition]]] = (
        field(default_factory=OrderedDict))
    heads: dict[int, int] = field(default_factory=dict)
    coalescers: dict[int, CallCoalescer] = field(default_factory=dict)
    pairs: dict[tuple[int, str], str] = field(default_factory=dict)
    figures: IndexedFigures = field(default_factory=IndexedFigures)

    async def latest(self, chain: Chain, batch: Batch) -> Answers:
        """Send ``batch`` as one ``eth_call`` at ``latest``, coalesced with the concurrent
        reads of ``chain`` (``coalescing``).

        :raises RpcError: from the pool (``RpcUnavailable``, ``ExecutionReverted``...).
        :raises AbiDecodeError: the answer is not what the views return.
        """
        coalescer = self.coalescers.get(chain.id)
        if coalescer is None:
            coalescer = self.coalescers[chain.id] = CallCoalescer(chain.pool)
        return batch.answers(await coalescer.call(batch.params(None), deadline=chain.deadline))

    async def ecosystem(self, chain: Chain, instance: str) -> Ecosystem:
        """The parts of dpnm ``instance`` (read once, then kept: they are immutable).

        :raises RpcError, AbiDecodeError: as ``latest``.
        """
        key = (chain.id, instance.lower())
        if key not in self.ecosystems:
            batch = Batch(chain.multicall)
            parts = batch.add(ECOSYSTEM, instance)
            answers = await self.latest(chain, batch)
            self.ecosystems[key] = parts.of(answers)
        return self.ecosystems[key]

    async def flow_position(self, chain: Chain, address: str) -> FlowPosition:
        """``address``'s FLOW position on ``chain`` (its ``flow_instance``): one ``eth_call``
        (none on a cache hit).

        :raises RpcError, AbiDecodeError: as ``latest``.
        """
        key = (chain.id, address.lower())
        cached = self.positions.get(key)
        now = trio.current_time()
        if (cached is not None and now - cached.stored_at < self.cache_seconds
                and cached.position.block >= self.known_head(chain)):
            return cached.position
        prepared = self.batches.get(key)
        if prepared is None:
            parts = await self.ecosystem(chain, chain.flow_instance)
            prepared = flow_position_batch(chain.multicall, chain.usdt, parts, address)
            _keep(self.batches, key, prepared)
        batch, position_of = prepared
        position = position_of(await self.latest(chain, batch))
        self._remember(chain, key, position)
        return position

    def known_head(self, chain: Chain) -> int:
        """The newest block of ``chain`` this process has seen."""
        seen = [endpoint.head_seen or 0 for endpoint in chain.pool.endpoints]
        return max([self.heads.get(chain.id, 0), *seen])

    def _remember(self, chain: Chain, key: tuple[int, str], position: FlowPosition) -> None:
        self.heads[chain.id] = max(self.heads.get(chain.id, 0), position.block)
        _keep(self.positions, key, _Cached(position, trio.current_time()))

    async def tree_walk(self, chain: Chain, address: str, depth: int) -> TreeWalk:
        """``address``'s tree position in ``chain``'s ``flow_instance`` and the sizes of its
        first ``depth`` levels: one ``eth_call`` at ``latest``, then one JSON-RPC request per
        level walked, pinned to its block. The walk stops early once the counted levels add
        up to the subtree size.

        :raises RpcError, AbiDecodeError: as ``send_all``.
        """
        parts = await self.ecosystem(chain, chain.flow_instance)
        batch = Batch(chain.multicall)
        state = batch.add(USER_STATE, parts.protocol, address)
        parent = batch.add(GET_PARENT, parts.tree, address)
        size = batch.add(GET_SUBTREE_SIZE, parts.tree, address)
        slots = [batch.add(GET_CHILD, parts.tree, address, slot) for slot in range(SLOTS)]
        first = await self.latest(chain, batch)
        subtree_size = size.of(first)
        occupants = [_address_or_none(slot.of(first)) for slot in slots]
        frontier = [child for child in occupants if child is not None]
        levels = [0] * LEVELS
        directs: list[Direct | None] = [None] * SLOTS
        level = 0
        while frontier and level < depth:
            levels[level] = len(frontier)
            expand = level + 1 < depth and sum(levels) < subtree_size
            if not expand and level > 0:
                break
            # The directs' details ride on the first follow-up request.
            children, details = await self._next_level(
                chain, parts.tree, frontier, with_details=level == 0, expand=expand,
                block=first.block)
            for child, (active, child_size) in details.items():
                directs[occupants.index(child)] = Direct(child, active, child_size)
            frontier = children
            level += 1
        return TreeWalk(block=first.block, activated=state.of(first).activated,
                        upline=_address_or_none(parent.of(first)), subtree_size=subtree_size,
                        subtree_by_level=levels, directs=directs)

    async def _next_level(self, chain: Chain, tree: str, nodes: list[str], *,
                          with_details: bool, expand: bool, block: int
                          ) -> tuple[list[str], dict[str, tuple[bool, int]]]:
        """The children of ``nodes`` (when ``expand``) and, ``with_details``, each node's
        (active, subtree size); every batch pinned to ``block``."""
        batches: list[Batch] = []
        child_slots = []
        detail_slots = []
        for node in nodes:
            if not batches or len(batches[-1].calls) + 2 * SLOTS > MAX_CALLS_PER_AGGREGATE:
                batches.append(Batch(chain.multicall))
            batch = batches[-1]
            if expand:
                child_slots.append((len(batches) - 1, [batch.add(GET_CHILD, tree, node, slot)
                                                       for slot in range(SLOTS)]))
            if with_details:
                detail_slots.append((node, len(batches) - 1, batch.add(IS_ACTIVE, tree, node),
                                     batch.add(GET_SUBTREE_SIZE, tree, node)))
        answers: list[Answers] = await send_all(chain.pool, batches, block=block,
                                                deadline=chain.deadline)
        children = [child for index, slots in child_slots for slot in slots
                    if (child := _address_or_none(slot.of(answers[index]))) is not None]
        details = {node: (active.of(answers[index]), size.of(answers[index]))
                   for node, index, active, size in detail_slots}
        return children, details

    async def dpnm_state(self, chain: Chain, instance: str) -> DpnmState:
        """A dpnm instance's price, pool and FLOW supply: one ``eth_call``.

        :raises RpcError, AbiDecodeError: as ``latest``.
        """
        parts = await self.ecosystem(chain, instance)
        batch = Batch(chain.multicall)
        price = batch.add(PRICE_FLOW, parts.protocol)
        pool = batch.add(POOL_USDT, parts.protocol)
        supply = batch.add(TOTAL_SUPPLY, parts.flow)
        answers = await self.latest(chain, batch)
        return DpnmState(block=answers.block, protocol=parts.protocol.lower(),
                         price=price.of(answers), pool_usdt=pool.of(answers),
                         total_supply=supply.of(answers))

    async def bonding_state(self, chain: Chain, bonding: str, token: str) -> BondingState:
        """A bonding-curve token's record, its pair's reserves and its supply: one
        ``eth_call`` (two the first time: the pair's address is read once, then kept).

        :raises RpcError, AbiDecodeError: as ``latest``.
        """
        key = (chain.id, token.lower())
        if key not in self.pairs:
            batch = Batch(chain.multicall)
            first = batch.add(TOKEN_INFO, bonding, token)
            answers = await self.latest(chain, batch)
            self.pairs[key] = first.of(answers).pair
        batch = Batch(chain.multicall)
        info = batch.add(TOKEN_INFO, bonding, token)
        reserves = batch.add(GET_RESERVES, self.pairs[key])
        supply = batch.add(TOTAL_SUPPLY, token)
        threshold = batch.add(GRAD_THRESHOLD, bonding)
        answers = await self.latest(chain, batch)
        return BondingState(block=answers.block, info=info.of(answers),
                            reserves=reserves.of(answers), total_supply=supply.of(answers),
                            grad_threshold=threshold.of(answers))
