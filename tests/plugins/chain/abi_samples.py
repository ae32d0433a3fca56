"""Sample values for ABI types, and web3 contract objects to check our codec against."""

from __future__ import annotations

import warnings
from typing import Any

from eth_utils.address import to_checksum_address


def sample(param: dict[str, Any], seed: int = 1) -> Any:
    """A value of ``param``'s type, different for each ``seed``: what eth_abi and web3 take."""
    kind: str = param["type"]
    if kind.endswith("[]"):
        item = {**param, "type": kind[:-2]}
        return [sample(item, seed), sample(item, seed + 1)]
    if kind == "tuple":
        return tuple(sample(component, seed + index)
                     for index, component in enumerate(param["components"]))
    if kind == "address":
        return to_checksum_address("0x" + f"{seed % 256:02x}" * 20)
    if kind == "bool":
        return seed % 2 == 1
    if kind.startswith("uint"):
        return (10**18 + seed) % 2 ** int(kind[4:] or 256)
    if kind == "bytes32":
        return bytes([seed % 256]) * 32
    if kind == "bytes":
        return bytes(range(seed % 7 + 1))
    if kind == "string":
        return f"value {seed}"
    raise AssertionError(f"no sample for {kind}")


def web3_contract(abi: list[dict[str, Any]]) -> Any:
    """``Web3().eth.contract(abi=abi)``: a contract object without a provider."""
    with warnings.catch_warnings():
        # web3 imports websockets' legacy client, which warns at import.
        warnings.filterwarnings("ignore", "websockets.legacy is deprecated", DeprecationWarning)
        from web3 import Web3
    return Web3().eth.contract(abi=abi)
