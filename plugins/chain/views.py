"""Typed views of the contracts in ``contracts`` and their batching through Multicall3.

Each view encodes its call and decodes its answer into a Python type (amounts as ints,
addresses checksummed); ``aggregate3_call_data`` packs many calls into one ``eth_call`` to
Multicall3 and ``decode_aggregate3`` splits its answer per call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, NamedTuple, TypeVar

from plugins.chain.abi import WORD, Function, Interface, address_word, checksum_address
from plugins.chain.contracts import (
    BONDING,
    DPNM_INSTANCE,
    ERC20,
    FLOW_PROTOCOL,
    FPAIR,
    MULTICALL3,
    PHENOMENAL_TREE,
)

T = TypeVar("T")


class Call3(NamedTuple):
    """One call of ``aggregate3``: with ``allow_failure`` a revert fails only this call."""

    target: str
    allow_failure: bool
    call_data: bytes


class Result3(NamedTuple):
    """One answer of ``aggregate3``: ``success`` False means the call reverted."""

    success: bool
    return_data: bytes


@dataclass(frozen=True)
class View(Generic[T]):
    """A view function and the type its answer decodes into."""

    function: Function
    convert: Callable[[tuple[Any, ...]], T]

    def encode(self, *args: Any) -> bytes:
        """Return the call data. Raises eth_abi's ``EncodingError`` for bad arguments."""
        return self.function.encode(*args)

    def decode(self, data: bytes) -> T:
        """Return the typed answer. Raises ``AbiDecodeError`` (empty data: no code there)."""
        return self.convert(self.function.decode(data))

    def call3(self, target: str, *args: Any, allow_failure: bool = True) -> Call3:
        """Return this view on ``target`` as one call of an ``aggregate3`` batch."""
        return Call3(target, allow_failure, self.encode(*args))


@dataclass(frozen=True)
class UserState:
    """``userState(address)`` of the FLOW protocol; amounts in 18-decimal base units."""

    activated: bool
    income_limit: int
    lifetime_limit: int
    day_start: int
    bought_today: int
    refill_credit: int
    refill_reset_at: int
    active_until: int
    gwt_pending: int


@dataclass(frozen=True)
class Ecosystem:
    """``ecosystem()`` of a dpnm instance: the addresses of its parts."""

    flow: str
    gwt: str
    tree: str
    protocol: str


@dataclass(frozen=True)
class Reserves:
    """``getReserves()`` of a bonding pair; the asset reserve includes virtual liquidity."""

    token_reserve: int
    asset_reserve: int


@dataclass(frozen=True)
class TokenData:
    """The ``data`` tuple of ``Bonding.tokenInfo``; its price fields are stale since May
    2025 (trades update only ``last_updated``): compute live figures from the pair."""

    token: str
    name: str
    internal_name: str
    ticker: str
    supply: int
    price: int
    market_cap: int
    liquidity: int
    volume: int
    volume_24h: int
    prev_price: int
    last_updated: int


@dataclass(frozen=True)
class TokenInfo:
    """``Bonding.tokenInfo(address)`` (the public getter leaves out the ``cores`` array)."""

    creator: str
    token: str
    pair: str
    agent_token: str
    data: TokenData
    description: str
    image: str
    twitter: str
    telegram: str
    youtube: str
    website: str
    trading: bool
    trading_on_uniswap: bool


def _uint(values: tuple[Any, ...]) -> int:
    return int(values[0])


def _bool(values: tuple[Any, ...]) -> bool:
    return bool(values[0])


def _address(values: tuple[Any, ...]) -> str:
    return checksum_address(values[0])


def _addresses(values: Sequence[Any]) -> list[str]:
    return [checksum_address(value) for value in values]


def _token_info(values: tuple[Any, ...]) -> TokenInfo:
    creator, token, pair, agent_token = _addresses(values[:4])
    data_token, *data_rest = values[4]
    return TokenInfo(creator, token, pair, agent_token,
                     TokenData(checksum_address(data_token), *data_rest), *values[5:])


def _view(interface: Interface, name: str, convert: Callable[[tuple[Any, ...]], T]) -> View[T]:
    return View(interface.functions[name], convert)


POOL_USDT = _view(FLOW_PROTOCOL, "poolUSDT", _uint)
PRICE_FLOW = _view(FLOW_PROTOCOL, "priceFLOW", _uint)
INCOME_LIMIT = _view(FLOW_PROTOCOL, "incomeLimit", _uint)
LIFETIME_INCOME_LIMIT = _view(FLOW_PROTOCOL, "lifetimeIncomeLimit", _uint)
IS_ACTIVATED = _view(FLOW_PROTOCOL, "isActivated", _bool)
PENDING_GWT = _view(FLOW_PROTOCOL, "pendingGWT", _uint)
DAILY_LIMIT_MAX = _view(FLOW_PROTOCOL, "dailyLimitMax", _uint)
USER_STATE = _view(FLOW_PROTOCOL, "userState", lambda values: UserState(*values))
PROTOCOL_USDT = _view(FLOW_PROTOCOL, "usdt", _address)
PROTOCOL_FLOW = _view(FLOW_PROTOCOL, "flow", _address)
PROTOCOL_GWT = _view(FLOW_PROTOCOL, "gwt", _address)
PROTOCOL_TREE = _view(FLOW_PROTOCOL, "tree", _address)
PROTOCOL_TREASURY = _view(FLOW_PROTOCOL, "treasury", _address)

GET_PARENT = _view(PHENOMENAL_TREE, "getParent", _address)
GET_CHILD = _view(PHENOMENAL_TREE, "getChild", _address)
GET_SUBTREE_SIZE = _view(PHENOMENAL_TREE, "getSubtreeSize", _uint)
GET_DEPTH = _view(PHENOMENAL_TREE, "getDepth", _uint)
ACTIVE_UNTIL = _view(PHENOMENAL_TREE, "activeUntil", _uint)
IS_ACTIVE = _view(PHENOMENAL_TREE, "isActive", _bool)
TREE_ROOT = _view(PHENOMENAL_TREE, "root", _address)

BALANCE_OF = _view(ERC20, "balanceOf", _uint)
TOTAL_SUPPLY = _view(ERC20, "totalSupply", _uint)
DECIMALS = _view(ERC20, "decimals", _uint)

ECOSYSTEM = _view(DPNM_INSTANCE, "ecosystem", lambda values: Ecosystem(*_addresses(values)))

TOKEN_INFO = _view(BONDING, "tokenInfo", _token_info)
GRAD_THRESHOLD = _view(BONDING, "gradThreshold", _uint)

GET_RESERVES = _view(FPAIR, "getReserves", lambda values: Reserves(*values))
PAIR_BALANCE = _view(FPAIR, "balance", _uint)
PAIR_ASSET_BALANCE = _view(FPAIR, "assetBalance", _uint)

_AGGREGATE3 = MULTICALL3.functions["aggregate3"]


def aggregate3_call_data(calls: Sequence[tuple[str, bool, bytes]]) -> bytes:
    """Return the call data of ``aggregate3(calls)`` (selector ``0x82ad56cb``) for calls of
    (target, allow failure, call data), such as ``Call3``, to send with ``eth_call`` to
    Multicall3. Raises eth_abi's ``EncodingError`` for a bad target.

    Written by hand (eth_abi's generic encoder took about a millisecond a batch), as eth_abi
    writes it: an array of (address, bool, bytes) tuples, each tuple's bytes behind an
    offset; a call eth_abi alone would refuse goes to eth_abi, which raises."""
    heads: list[bytes] = []
    tails: list[bytes] = []
    offset = WORD * len(calls)
    for target, allow_failure, data in calls:
        target_word = address_word(target) if isinstance(target, str) else None
        if target_word is None or type(allow_failure) is not bool or type(data) is not bytes:
            return _AGGREGATE3.encode(list(calls))
        padding = -len(data) % WORD
        tail = b"".join((target_word, _word(allow_failure), _word(3 * WORD),
                         _word(len(data)), data, b"\x00" * padding))
        heads.append(_word(offset))
        tails.append(tail)
        offset += len(tail)
    return b"".join((_AGGREGATE3.selector, _word(WORD), _word(len(calls)), *heads, *tails))


def _word(value: int) -> bytes:
    return value.to_bytes(WORD, "big")


def decode_aggregate3(data: bytes) -> list[Result3]:
    """Return the per-call answers of ``aggregate3``, in the order of the calls.
    Raises ``AbiDecodeError``."""
    (results,) = _AGGREGATE3.decode(data)
    return [Result3(bool(success), bytes(return_data)) for success, return_data in results]
