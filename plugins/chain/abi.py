"""The ABIs flowsvc reads, built from the human-readable signatures of ``shared/spec/chain.md``
(no compiled artifact), with eth-abi's codec: call encoding, result decoding, log decoding.

The ABI JSON of each ``Interface`` is what ``Web3().eth.contract(abi=...)`` takes; encoding and
decoding go straight through ``eth_abi`` (the codec web3 itself uses), without web3's per-call
overhead, which matters when the indexer decodes a range full of events. Amounts stay ints.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_abi.abi import decode, encode
from eth_abi.exceptions import DecodingError
from eth_abi.grammar import parse as parse_type
from eth_utils.abi import (
    collapse_if_tuple,
    event_signature_to_log_topic,
    function_signature_to_4byte_selector,
)
from eth_utils.address import to_checksum_address

Abi = dict[str, Any]


class AbiDecodeError(ValueError):
    """Data that does not decode as the ABI says: empty return data (a call to an address
    without code), a truncated answer, an unknown event or one with the wrong topic count."""


class Function:
    """One contract function: its ABI, selector and codec."""

    def __init__(self, abi: Abi) -> None:
        self.abi = abi
        self.name: str = abi["name"]
        self.selector = function_signature_to_4byte_selector(_canonical(abi))
        self._inputs = _types(abi["inputs"])
        self._outputs = _types(abi["outputs"])

    def encode(self, *args: Any) -> bytes:
        """Return the call data: selector and arguments. Raises eth_abi's ``EncodingError``
        for arguments that do not fit the types."""
        return self.selector + encode(self._inputs, args)

    def decode(self, data: bytes) -> tuple[Any, ...]:
        """Return the decoded return values. Raises ``AbiDecodeError``."""
        return _decode(self._outputs, data, self.name)


class Event:
    """One event of an interface: its ABI, topic0 and codec."""

    def __init__(self, abi: Abi, interface: str) -> None:
        self.abi = abi
        self.interface = interface
        self.name: str = abi["name"]
        self.topic0 = event_signature_to_log_topic(_canonical(abi))
        self._indexed = [param for param in abi["inputs"] if param["indexed"]]
        self._plain = [param for param in abi["inputs"] if not param["indexed"]]
        self._plain_types = _types(self._plain)

    def decode_args(self, topics: Sequence[bytes], data: bytes) -> dict[str, Any]:
        """Return the event's arguments by name, in the ABI's order; addresses checksummed.
        An indexed argument of a dynamic type is only its keccak hash in the topic, so it comes
        back as those 32 bytes.

        :raises AbiDecodeError: wrong topic count or data that does not decode.
        """
        if len(topics) != len(self._indexed) + 1:
            # e.g. ERC-721's Transfer: same topic0 as ERC-20's, one more indexed argument.
            raise AbiDecodeError(f"{self.name} has {len(self._indexed)} indexed arguments, "
                                 f"the log {len(topics) - 1}")
        values: dict[str, Any] = {}
        for param, topic in zip(self._indexed, topics[1:], strict=True):
            kind = collapse_if_tuple(param)
            values[param["name"]] = (topic if parse_type(kind).is_dynamic
                                     else _decode([kind], topic, self.name)[0])
        plain = _decode(self._plain_types, data, self.name)
        values.update(zip((param["name"] for param in self._plain), plain, strict=True))
        return {param["name"]: _typed(param, values[param["name"]])
                for param in self.abi["inputs"]}


@dataclass(frozen=True)
class Interface:
    """A contract interface: its functions and events by name, and its ABI JSON."""

    name: str
    abi: list[Abi]
    functions: Mapping[str, Function]
    events: Mapping[str, Event]

    @classmethod
    def of(cls, name: str, *signatures: str) -> Interface:
        """Build an interface from signatures such as ``"function balanceOf(address owner)
        returns (uint256)"`` and ``"event Transfer(address indexed from, ...)"``.

        :raises ValueError: a signature that does not parse.
        """
        abi = [parse_signature(signature) for signature in signatures]
        return cls(name, abi,
                   {item["name"]: Function(item) for item in abi if item["type"] == "function"},
                   {item["name"]: Event(item, name) for item in abi if item["type"] == "event"})


def parse_signature(signature: str) -> Abi:
    """Return the ABI JSON entry of one human-readable function or event signature. Functions
    are marked ``view`` (flowsvc only reads); unnamed parameters are named ``arg<i>``.

    :raises ValueError: the signature does not parse.
    """
    kind, _, rest = signature.strip().partition(" ")
    name, opening, _ = rest.partition("(")
    if kind not in ("function", "event") or not opening or not name.strip().isidentifier():
        raise ValueError(f"not a function or event signature: {signature!r}")
    inputs, after = _parenthesised(rest[len(name):])
    entry: Abi = {"type": kind, "name": name.strip(), "inputs": _params(inputs, kind == "event")}
    if kind == "event":
        entry["anonymous"] = False
        return entry
    _, returns, outputs = after.partition("returns")
    entry["outputs"] = _params(_parenthesised(outputs)[0], False) if returns else []
    entry["stateMutability"] = "view"
    return entry


def hex_bytes(value: str) -> bytes:
    """Return the bytes of a ``0x`` hex string from JSON-RPC. Raises ``AbiDecodeError``."""
    if not isinstance(value, str) or not value.startswith("0x"):
        raise AbiDecodeError(f"expected 0x hex, got {str(value)[:40]!r}")
    try:
        return bytes.fromhex(value[2:])
    except ValueError:
        raise AbiDecodeError(f"expected 0x hex, got {value[:40]!r}") from None


def _parenthesised(text: str) -> tuple[str, str]:
    """Split ``"(a, (b, c)) rest"`` into the inside of the first balanced group and the rest."""
    start = text.index("(")
    depth = 0
    for position in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[position], 0)
        if depth == 0:
            return text[start + 1:position], text[position + 1:]
    raise ValueError(f"unbalanced parentheses in {text!r}")


def _params(text: str, is_event: bool) -> list[Abi]:
    params: list[Abi] = []
    depth = 0
    piece = ""
    for char in text + ",":
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            if piece.strip():
                params.append(_param(piece.strip(), len(params), is_event))
            piece = ""
        else:
            piece += char
    return params


def _param(text: str, index: int, is_event: bool) -> Abi:
    param: Abi = {}
    if text.startswith("("):
        inside, rest = _parenthesised(text)
        suffix, _, rest = rest.partition(" ")
        param.update(type="tuple" + suffix, components=_params(inside, False))
        words = rest.split()
    else:
        kind, *words = text.split()
        param["type"] = {"uint": "uint256", "int": "int256"}.get(kind, kind)
    if is_event:
        param["indexed"] = "indexed" in words
    names = [word for word in words if word not in ("indexed", "memory", "calldata")]
    param["name"] = names[0] if names else f"arg{index}"
    return param


def _canonical(entry: Abi) -> str:
    """``name(type,...)``: what a selector or topic0 is the keccak of."""
    return f"{entry['name']}({','.join(_types(entry['inputs']))})"


def _types(params: Sequence[Abi]) -> list[str]:
    return [collapse_if_tuple(param) for param in params]


def _typed(param: Abi, value: Any) -> Any:
    return to_checksum_address(value) if param["type"] == "address" else value


def _decode(types: Sequence[str], data: bytes, what: str) -> tuple[Any, ...]:
    try:
        return tuple(decode(types, data))
    except DecodingError as error:
        raise AbiDecodeError(f"{what}: {error}") from None
