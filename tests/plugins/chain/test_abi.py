"""Signatures to ABI JSON, the codec of functions and events, and exact unit formatting."""

from __future__ import annotations

from typing import Any

import pytest
from eth_abi.abi import encode
from eth_utils.crypto import keccak

from plugins.chain.abi import (
    AbiDecodeError,
    Interface,
    hex_bytes,
    parse_signature,
)
from plugins.chain.contracts import BONDING, ERC20, FLOW_PROTOCOL, INDEXED, MULTICALL3
from tests.plugins.chain.abi_samples import sample, web3_contract

EVERY_INTERFACE = [*INDEXED, MULTICALL3]


def test_a_function_signature_becomes_abi_json() -> None:
    assert parse_signature("function getChild(address user, uint i) returns (address)") == {
        "type": "function", "name": "getChild", "stateMutability": "view",
        "inputs": [{"type": "address", "name": "user"}, {"type": "uint256", "name": "i"}],
        "outputs": [{"type": "address", "name": "arg0"}]}


def test_tuples_and_arrays_of_tuples_nest() -> None:
    entry = parse_signature("function f((address a, (bool b, bytes c)[] d)[] calls) "
                            "returns (uint8)")
    assert entry["inputs"] == [{"type": "tuple[]", "name": "calls", "components": [
        {"type": "address", "name": "a"},
        {"type": "tuple[]", "name": "d", "components": [
            {"type": "bool", "name": "b"}, {"type": "bytes", "name": "c"}]}]}]


def test_an_event_signature_marks_indexed_arguments_and_names_unnamed_ones() -> None:
    assert parse_signature("event Launched(address indexed token, address indexed pair, "
                           "uint256)") == {
        "type": "event", "name": "Launched", "anonymous": False, "inputs": [
            {"type": "address", "name": "token", "indexed": True},
            {"type": "address", "name": "pair", "indexed": True},
            {"type": "uint256", "name": "arg2", "indexed": False}]}


@pytest.mark.parametrize("signature", [
    "constructor(address a)", "function (uint256 a)", "function f(uint256 a", "event",
    "function f-g()",
])
def test_a_bad_signature_is_refused(signature: str) -> None:
    with pytest.raises(ValueError):
        parse_signature(signature)


@pytest.mark.parametrize(("interface", "name", "selector"), [
    (MULTICALL3, "aggregate3", "82ad56cb"),
    (ERC20, "balanceOf", "70a08231"),
    (ERC20, "totalSupply", "18160ddd"),
    (ERC20, "decimals", "313ce567"),
])
def test_known_selectors(interface: Interface, name: str, selector: str) -> None:
    assert interface.functions[name].selector.hex() == selector


@pytest.mark.parametrize("interface", EVERY_INTERFACE, ids=lambda interface: interface.name)
def test_every_call_encodes_as_web3_encodes_it(interface: Interface) -> None:
    contract = web3_contract(interface.abi)
    for function in interface.functions.values():
        args = [sample(param, seed) for seed, param in enumerate(function.abi["inputs"], 3)]
        assert "0x" + function.encode(*args).hex() == contract.encode_abi(function.name, args)


@pytest.mark.parametrize("interface", EVERY_INTERFACE, ids=lambda interface: interface.name)
def test_every_result_decodes_what_eth_abi_encodes(interface: Interface) -> None:
    for function in interface.functions.values():
        outputs = function.abi["outputs"]
        values = tuple(sample(param, seed) for seed, param in enumerate(outputs, 5))
        data = encode([_canonical(param) for param in outputs], values)
        decoded = function.decode(data)
        assert _lowered(decoded) == _lowered(values)


def test_truncated_or_empty_answers_do_not_decode() -> None:
    balance_of = ERC20.functions["balanceOf"]
    with pytest.raises(AbiDecodeError, match="balanceOf"):
        balance_of.decode(b"")
    with pytest.raises(AbiDecodeError):
        BONDING.functions["tokenInfo"].decode(encode(["uint256"], [32]))


def test_event_topics_are_the_keccak_of_their_canonical_signatures() -> None:
    assert FLOW_PROTOCOL.events["RewardPaid"].topic0 == keccak(
        text="RewardPaid(address,address,uint256,uint256)")
    assert ERC20.events["Transfer"].topic0.hex() == (
        "ddf252ad1be2c89b69c2b068fc378daa952ba7f163c4a11628f55a4df523b3ef")


@pytest.mark.parametrize("text", ["", "0x0", "12", "0xzz"])
def test_hex_bytes_refuses_what_is_not_even_0x_hex(text: str) -> None:
    with pytest.raises(AbiDecodeError):
        hex_bytes(text)


def _canonical(param: dict[str, Any]) -> str:
    kind: str = param["type"]
    if not kind.startswith("tuple"):
        return kind
    return "(" + ",".join(_canonical(component) for component in param["components"]) + ")" + (
        kind[len("tuple"):])


def _lowered(value: Any) -> Any:
    """Compare addresses case-blind: eth_abi decodes them in lower case."""
    if isinstance(value, str) and value.startswith("0x"):
        return value.lower()
    if isinstance(value, list | tuple):
        return [_lowered(item) for item in value]
    return value
