"""The contracts flowsvc reads, from the public interfaces in ``shared/spec/chain.md``, and the
decoding of the logs the indexer follows.

Bonding's ``Launched`` has an unnamed third argument (the token's ordinal), named ``arg2``.
The factory's ``Launched`` and Bonding's share a name, not a signature: their topic0s differ,
and ``DecodedEvent.interface`` tells them apart.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_utils.crypto import keccak

from plugins.chain.abi import AbiDecodeError, Event, Interface, checksum_address, hex_bytes

FLOW_PROTOCOL = Interface.of(
    "FlowProtocol",
    "function poolUSDT() returns (uint256)",
    "function priceFLOW() returns (uint256)",
    "function incomeLimit(address user) returns (uint256)",
    "function lifetimeIncomeLimit(address user) returns (uint256)",
    "function isActivated(address user) returns (bool)",
    "function pendingGWT(address user) returns (uint256)",
    "function dailyLimitMax() returns (uint256)",
    "function userState(address user) returns (bool activated, uint256 incomeLimit, "
    "uint256 lifetimeLimit, uint64 dayStart, uint256 boughtToday, uint256 refillCredit, "
    "uint64 refillResetAt, uint256 activeUntil, uint256 gwtPending)",
    "function usdt() returns (address)",
    "function flow() returns (address)",
    "function gwt() returns (address)",
    "function tree() returns (address)",
    "function treasury() returns (address)",
    "event Activated(address indexed user, address indexed referrer, uint256 depth)",
    "event Bought(address indexed user, uint256 usdtIn, uint256 flowOut, uint256 priceAfter, "
    "uint256 incomeLimitAfter)",
    "event Sold(address indexed user, uint256 flowIn, uint256 usdtOut, uint256 priceAfter, "
    "uint256 incomeLimitAfter, uint256 flowBurned)",
    "event TreeExtended(address indexed user, uint256 months, uint256 activeUntil)",
    "event IncomeLimitBoughtWithGWT(address indexed user, uint256 gwtBurned, "
    "uint256 limitGained)",
    "event GWTClaimed(address indexed user, uint256 amount)",
    "event RewardPaid(address indexed payer, address indexed ancestor, uint256 levelIndex, "
    "uint256 amount)",
)

PHENOMENAL_TREE = Interface.of(
    "PhenomenalTree",
    "function getParent(address user) returns (address)",
    "function getChild(address user, uint256 i) returns (address)",
    "function getSubtreeSize(address user) returns (uint256)",
    "function getDepth(address user) returns (uint256)",
    "function activeUntil(address user) returns (uint256)",
    "function isActive(address user) returns (bool)",
    "function root() returns (address)",
    "event UserPlaced(address indexed user, address indexed referrer, address indexed parent, "
    "uint256 depth)",
    "event ActiveUntilSet(address indexed user, uint256 activeUntil)",
)

ERC20 = Interface.of(
    "ERC20",
    "function balanceOf(address owner) returns (uint256)",
    "function totalSupply() returns (uint256)",
    "function decimals() returns (uint8)",
    "event Transfer(address indexed from, address indexed to, uint256 value)",
)

LAUNCHPAD_FACTORY = Interface.of(
    "LaunchpadFactory",
    "event Launched(bytes32 indexed id, address indexed instance, address indexed deployer, "
    "bytes32 salt, bytes params)",
)

DPNM_INSTANCE = Interface.of(
    "DpnmInstance",
    "function ecosystem() returns (address flow, address gwt, address tree, address protocol)",
)

BONDING = Interface.of(
    "Bonding",
    "function tokenInfo(address token) returns (address creator, address token, address pair, "
    "address agentToken, (address token, string name, string _name, string ticker, "
    "uint256 supply, uint256 price, uint256 marketCap, uint256 liquidity, uint256 volume, "
    "uint256 volume24H, uint256 prevPrice, uint256 lastUpdated) data, string description, "
    "string image, string twitter, string telegram, string youtube, string website, "
    "bool trading, bool tradingOnUniswap)",
    "function gradThreshold() returns (uint256)",
    "event Launched(address indexed token, address indexed pair, uint256)",
    "event Graduated(address indexed token, address agentToken)",
)

FPAIR = Interface.of(
    "FPair",
    "function getReserves() returns (uint256 tokenReserve, uint256 assetReserve)",
    "function balance() returns (uint256)",
    "function assetBalance() returns (uint256)",
    "event Swap(uint256 amount0In, uint256 amount0Out, uint256 amount1In, uint256 amount1Out)",
)

MULTICALL3 = Interface.of(
    "Multicall3",
    "function aggregate3((address target, bool allowFailure, bytes callData)[] calls) "
    "returns ((bool success, bytes returnData)[] returnData)",
)
MULTICALL3_ADDRESS = "0xcA11bde05977b3631167028862bE2a173976CA11"

# The factory's template ids are the keccak256 of the template names.
TEMPLATES: Mapping[bytes, str] = {keccak(text=name): name
                                  for name in ("dpnm", "virtuals", "dpnm-v2")}

# Every interface whose events the indexer follows.
INDEXED = (FLOW_PROTOCOL, PHENOMENAL_TREE, ERC20, LAUNCHPAD_FACTORY, BONDING, FPAIR)


@dataclass(slots=True)
class DecodedEvent:
    """One log decoded: which event of which interface, its arguments (amounts as ints,
    addresses checksummed) and where it sits on the chain (hashes as lowercase 0x hex).
    Read-only by convention, not frozen: the indexer makes one per log, and a frozen
    dataclass's ``__init__`` cost more than the decoding itself."""

    interface: str
    name: str
    args: dict[str, Any]
    address: str
    block_number: int
    block_hash: str
    transaction_hash: str
    log_index: int


def _by_topic() -> dict[bytes, Event]:
    events: dict[bytes, Event] = {}
    for interface in INDEXED:
        for event in interface.events.values():
            if event.topic0 in events:
                raise ValueError(f"{interface.name}.{event.name} shares its topic0")
            events[event.topic0] = event
    return events


_EVENTS = _by_topic()


def decode_log(raw_log: Mapping[str, Any]) -> DecodedEvent:
    """Decode a log as JSON-RPC's ``eth_getLogs`` returns it (hex strings) into the event of
    an indexed interface it is.

    :raises AbiDecodeError: not an event we index, the wrong topic count for it, a pending log
        (no block), or fields that are not what JSON-RPC sends.
    """
    try:
        return decode_fields(
            raw_log["address"], raw_log["topics"], raw_log["data"],
            block_number=_number(raw_log["blockNumber"]),
            block_hash=_hash(raw_log["blockHash"]),
            transaction_hash=_hash(raw_log["transactionHash"]),
            log_index=_number(raw_log["logIndex"]))
    except AbiDecodeError:
        raise
    except (KeyError, TypeError, ValueError) as error:  # a field missing, or not an address
        raise AbiDecodeError(f"not a JSON-RPC log: {error!r}") from None


def decode_fields(address: str, topics: Sequence[str], data: str, *, block_number: int,
                  block_hash: str, transaction_hash: str, log_index: int) -> DecodedEvent:
    """Decode a log already taken apart (hashes lowercase 0x hex, as ``decode_log`` makes
    them; the indexer's ``RawLog``).

    :raises AbiDecodeError: as ``decode_log``.
    """
    try:
        words = [hex_bytes(topic) for topic in topics]
        event = _EVENTS.get(words[0]) if words else None
        if event is None:
            raise AbiDecodeError(f"not an indexed event: {list(topics[:1])}")
        return DecodedEvent(
            interface=event.interface, name=event.name,
            args=event.decode_args(words, hex_bytes(data)), address=checksum_address(address),
            block_number=block_number, block_hash=block_hash,
            transaction_hash=transaction_hash, log_index=log_index)
    except AbiDecodeError:
        raise
    except (TypeError, ValueError) as error:  # not an address
        raise AbiDecodeError(f"not a JSON-RPC log: {error!r}") from None


def topic0s(*interfaces: Interface) -> list[str]:
    """Return the topic0 (0x hex) of every event of ``interfaces``: the first position of an
    ``eth_getLogs`` topic filter, ``[topic0s(FLOW_PROTOCOL, PHENOMENAL_TREE)]``."""
    return ["0x" + event.topic0.hex() for interface in interfaces
            for event in interface.events.values()]


def _number(value: Any) -> int:
    if not isinstance(value, str) or not value.startswith("0x"):
        raise AbiDecodeError(f"expected a hex quantity, got {str(value)[:40]!r}")
    return int(value, 16)


def _hash(value: Any) -> str:
    raw = hex_bytes(value)
    if len(raw) != 32:
        raise AbiDecodeError(f"expected a 32-byte hash, got {len(raw)} bytes")
    return "0x" + raw.hex()
