"""Decoding the logs the indexer follows, checked against hand-built logs and against web3."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import encode
from eth_utils.address import to_checksum_address
from eth_utils.crypto import keccak

from plugins.chain.abi import AbiDecodeError
from plugins.chain.contracts import (
    BONDING,
    FLOW_PROTOCOL,
    INDEXED,
    LAUNCHPAD_FACTORY,
    TEMPLATES,
    decode_log,
    topic0s,
)
from tests.plugins.chain.abi_samples import web3_contract

# Every indexed event as chain.md states it: (interface, canonical signature, indexed count).
EVENTS = [
    ("FlowProtocol", "Activated(address,address,uint256)", 2),
    ("FlowProtocol", "Bought(address,uint256,uint256,uint256,uint256)", 1),
    ("FlowProtocol", "Sold(address,uint256,uint256,uint256,uint256,uint256)", 1),
    ("FlowProtocol", "TreeExtended(address,uint256,uint256)", 1),
    ("FlowProtocol", "IncomeLimitBoughtWithGWT(address,uint256,uint256)", 1),
    ("FlowProtocol", "GWTClaimed(address,uint256)", 1),
    ("FlowProtocol", "RewardPaid(address,address,uint256,uint256)", 2),
    ("PhenomenalTree", "UserPlaced(address,address,address,uint256)", 3),
    ("PhenomenalTree", "ActiveUntilSet(address,uint256)", 1),
    ("ERC20", "Transfer(address,address,uint256)", 2),
    ("LaunchpadFactory", "Launched(bytes32,address,address,bytes32,bytes)", 3),
    ("Bonding", "Launched(address,address,uint256)", 2),
    ("Bonding", "Graduated(address,address)", 1),
    ("FPair", "Swap(uint256,uint256,uint256,uint256)", 0),
]
BLOCK_HASH = "0x" + "b1" * 32
TX_HASH = "0x" + "7a" * 32
EMITTER = "0x" + "e0" * 20


def value_of(kind: str, position: int) -> Any:
    if kind == "address":
        return to_checksum_address("0x" + f"{position + 0x31:02x}" * 20)
    if kind == "uint256":
        return 10**18 * (position + 1) + 7  # an 18-decimal amount with a remainder
    if kind == "bytes32":
        return bytes([position]) * 32
    return b"params " + bytes([position])


def raw_log(signature: str, indexed: int, values: list[Any]) -> dict[str, Any]:
    """A log exactly as eth_getLogs returns it, built without our codec."""
    kinds = signature[signature.index("(") + 1:-1].split(",")
    topics = [keccak(text=signature)] + [encode([kind], [value]) for kind, value in
                                         zip(kinds[:indexed], values[:indexed], strict=True)]
    data = encode(kinds[indexed:], values[indexed:])
    return {"address": EMITTER, "topics": ["0x" + topic.hex() for topic in topics],
            "data": "0x" + data.hex(), "blockNumber": "0x1b4", "blockHash": BLOCK_HASH,
            "transactionHash": TX_HASH, "transactionIndex": "0x3", "logIndex": "0x1f",
            "removed": False}


@pytest.mark.parametrize(("interface", "signature", "indexed"), EVENTS,
                         ids=[f"{interface}.{signature}" for interface, signature, _ in EVENTS])
def test_every_indexed_event_decodes(interface: str, signature: str, indexed: int) -> None:
    kinds = signature[signature.index("(") + 1:-1].split(",")
    values = [value_of(kind, position) for position, kind in enumerate(kinds)]
    event = decode_log(raw_log(signature, indexed, values))
    assert (event.interface, event.name) == (interface, signature[:signature.index("(")])
    assert list(event.args.values()) == values
    assert (event.address, event.block_number, event.block_hash, event.transaction_hash,
            event.log_index) == (to_checksum_address(EMITTER), 436, BLOCK_HASH, TX_HASH, 31)


def test_a_known_sold_log_decodes_to_exact_amounts_and_as_web3_decodes_it() -> None:
    user = to_checksum_address("0x" + "12" * 20)
    amounts = [1500 * 10**18 + 1, 37 * 10**17, 10**18 // 3, 2 * 10**18, 0]
    log = raw_log("Sold(address,uint256,uint256,uint256,uint256,uint256)", 1, [user, *amounts])
    event = decode_log(log)
    assert event.args == {"user": user, "flowIn": amounts[0], "usdtOut": amounts[1],
                          "priceAfter": amounts[2], "incomeLimitAfter": amounts[3],
                          "flowBurned": amounts[4]}
    # web3's process_log wants bytes and ints where JSON-RPC sends hex.
    typed = {**log, "topics": [bytes.fromhex(topic[2:]) for topic in log["topics"]],
             "data": bytes.fromhex(log["data"][2:]), "blockNumber": 436,
             "transactionIndex": 3, "logIndex": 31}
    processed = web3_contract(FLOW_PROTOCOL.abi).events.Sold().process_log(typed)
    assert dict(processed["args"]) == event.args


def test_the_two_launched_events_are_told_apart() -> None:
    template = keccak(text="dpnm")
    instance = to_checksum_address("0x" + "44" * 20)
    factory = decode_log(raw_log("Launched(bytes32,address,address,bytes32,bytes)", 3,
                                 [template, instance, instance, b"\0" * 32, b"\x01\x02"]))
    assert factory.interface == "LaunchpadFactory"
    assert TEMPLATES[factory.args["id"]] == "dpnm"
    assert factory.args["params"] == b"\x01\x02"
    bonding = decode_log(raw_log("Launched(address,address,uint256)", 2,
                                 [instance, instance, 12]))
    assert (bonding.interface, bonding.args["arg2"]) == ("Bonding", 12)
    assert LAUNCHPAD_FACTORY.events["Launched"].topic0 != BONDING.events["Launched"].topic0


def test_templates_are_the_keccak_of_their_names() -> None:
    assert TEMPLATES == {keccak(text=name): name for name in ("dpnm", "virtuals", "dpnm-v2")}


def test_topic0s_list_every_event_for_a_log_filter() -> None:
    every = topic0s(*INDEXED)
    assert len(every) == len(set(every)) == len(EVENTS)
    assert sorted(every) == sorted("0x" + keccak(text=signature).hex()
                                   for _, signature, _ in EVENTS)
    assert topic0s(FLOW_PROTOCOL)[0] == "0x" + keccak(
        text="Activated(address,address,uint256)").hex()


def broken(**changes: Any) -> dict[str, Any]:
    log = raw_log("GWTClaimed(address,uint256)", 1, [EMITTER, 5])
    return {key: value for key, value in {**log, **changes}.items() if value != "drop"}


@pytest.mark.parametrize("log", [
    # ERC-721's Transfer shares ERC-20's topic0 but indexes the token id too.
    raw_log("Transfer(address,address,uint256)", 3, [EMITTER, EMITTER, 9]),
    raw_log("Approval(address,address,uint256)", 2, [EMITTER, EMITTER, 9]),
    broken(topics=[]),
    broken(blockNumber=None),  # a pending log
    broken(data="0x"),
    broken(data="0x12"),
    broken(logIndex="drop"),
    broken(address="0x1234"),
    broken(blockHash="0x1234"),
    broken(transactionHash=None),
])
def test_what_is_not_an_indexed_event_is_refused(log: dict[str, Any]) -> None:
    with pytest.raises(AbiDecodeError):
        decode_log(log)
