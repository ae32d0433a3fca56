"""The ABIs flowsvc reads, built from the human-readable signatures of ``shared/spec/chain.md``
(no compiled artifact), with eth-abi's codec: call encoding, result decoding, log decoding.

The ABI JSON of each ``Interface`` is what ``Web3().eth.contract(abi=...)`` takes; encoding and
decoding go straight through ``eth_abi`` (the codec web3 itself uses), without web3's per-call
overhead, which matters when the indexer decodes a range full of events. Amounts stay ints.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from eth_abi.abi import decode, encode
from eth_abi.exceptions import DecodingError
from eth_abi.grammar import parse as parse_type
from eth_utils.abi import (
    collapse_if_tuple,
    event_signature_to_log_topic,
    function_signature_to_4byte_selector,
)
from eth_utils.address import is_address, to_checksum_address

Abi = dict[str, Any]
WORD = 32
WordReader = Callable[[bytes], Any]
WordWriter = Callable[[Any], bytes | None]


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
        writers = [word_writer(kind) for kind in self._inputs]
        self._writers = None if None in writers else [
            writer for writer in writers if writer is not None]

    def encode(self, *args: Any) -> bytes:
        """Return the call data: selector and arguments. Raises eth_abi's ``EncodingError``
        for arguments that do not fit the types."""
        if self._writers is not None and len(args) == len(self._writers):
            words = [write(arg) for write, arg in zip(self._writers, args, strict=True)]
            if None not in words:
                return self.selector + b"".join(word for word in words if word is not None)
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
        # Built once: each indexed argument's reader (None: a dynamic type, kept as its
        # hash), and the plain arguments' readers when every one is a 32-byte word; address
        # readers checksum (the ABI's order is rebuilt only when indexed arguments do not
        # come first).
        self._topic_readers = [None if parse_type(kind).is_dynamic else
                               _checksummed(word_reader(kind), kind)
                               or _eth_abi_reader(kind, self.name)
                               for kind in _types(self._indexed)]
        plain = [_checksummed(word_reader(kind), kind) for kind in self._plain_types]
        self._plain_words = None if None in plain else [
            (read, WORD * at, WORD * (at + 1)) for at, read in enumerate(plain)
            if read is not None]
        self._names = [param["name"] for param in self._indexed + self._plain]
        self._order = [param["name"] for param in abi["inputs"]]
        self._reordered = self._names != self._order
        self._addresses = [param["name"] for param in self._plain
                           if param["type"] == "address"]

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
        values: list[Any] = []
        for topic, read in zip(topics[1:], self._topic_readers, strict=True):
            if read is None:
                values.append(topic)
            elif len(topic) != WORD:
                raise AbiDecodeError(f"{self.name}: a topic of {len(topic)} bytes")
            else:
                values.append(read(topic))
        if self._plain_words is None:
            values.extend(_decode(self._plain_types, data, self.name))
        elif len(data) < WORD * len(self._plain_words):
            raise AbiDecodeError(f"{self.name}: {len(data)} bytes, expected "
                                 f"{WORD * len(self._plain_words)}")
        else:
            values.extend([read(data[start:end]) for read, start, end in self._plain_words])
        args = dict(zip(self._names, values, strict=True))
        if self._plain_words is None:
            for name in self._addresses:  # eth_abi's: checksummed, as ours
                args[name] = checksum_address(args[name])
        if not self._reordered:
            return args
        return {name: args[name] for name in self._order}


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


# Every 32-byte-word value (uints, bools, addresses, bytesN) is read by hand: eth_abi's
# generic codec costs tens of microseconds a value, and the indexer and the on-chain reads
# decode thousands of them (tests/plugins/chain/test_abi.py compares both).


def word_reader(kind: str) -> WordReader | None:
    """How to read one static ABI value of ``kind`` from its word, with eth_abi's checks, or
    None for a kind that is not one word read here."""
    if kind == "bool":
        return _bool_word
    if kind == "address":
        return _address_word
    if kind == "uint256":
        return _uint256_word  # every word is in range: no check
    if kind.startswith("uint") and kind[4:].isdigit():
        bits = int(kind[4:])
        return lambda word: _uint_word(word, bits)
    if kind.startswith("bytes") and kind[5:].isdigit():
        size = int(kind[5:])
        return lambda word: _bytes_word(word, size)
    return None


def word_writer(kind: str) -> WordWriter | None:
    """How to write one static ABI value of ``kind`` as its word (None from the writer for
    a value it does not take plainly, which eth_abi then encodes or refuses), or None for a
    kind that is not one word written here."""
    if kind == "bool":
        return lambda value: (b"\x00" * 31 + bytes([value])) if type(value) is bool else None
    if kind == "address":
        return lambda value: address_word(value) if isinstance(value, str) else None
    if kind.startswith("uint") and kind[4:].isdigit():
        bits = int(kind[4:])
        return lambda value: (value.to_bytes(WORD, "big")
                              if type(value) is int and 0 <= value < 1 << bits else None)
    return None


@lru_cache(maxsize=65_536)
def address_word(address: str) -> bytes | None:
    """``address`` as an ABI word, or None when it is not an address eth_abi takes (a
    mixed-case one must be a valid checksum)."""
    if not is_address(address) or len(address) != 42:
        return None
    return b"\x00" * 12 + bytes.fromhex(address[2:])


def read_words(readers: Sequence[WordReader], data: bytes, what: str) -> tuple[Any, ...]:
    """The values of an answer made only of words (``word_reader``'s), one per reader.

    :raises AbiDecodeError: ``data`` is shorter than the words or a word is out of range.
    """
    if len(data) < WORD * len(readers):
        raise AbiDecodeError(f"{what}: {len(data)} bytes, expected {WORD * len(readers)}")
    return tuple(read(data[WORD * at:WORD * (at + 1)]) for at, read in enumerate(readers))


@lru_cache(maxsize=65_536)
def checksum_address(address: str) -> str:
    """EIP-55 checksummed ``address`` (a keccak each: the same few addresses recur in every
    log and answer, so they are kept)."""
    return to_checksum_address(address)


def _uint256_word(word: bytes) -> int:
    return int.from_bytes(word, "big")


def _uint_word(word: bytes, bits: int) -> int:
    value = int.from_bytes(word, "big")
    if value >> bits:
        raise AbiDecodeError(f"uint{bits} out of range: {value}")
    return value


def _bool_word(word: bytes) -> bool:
    value = int.from_bytes(word, "big")
    if value > 1:
        raise AbiDecodeError(f"a bool must be 0 or 1, got {value}")
    return value == 1


_ADDRESS_PADDING = bytes(12)


def _address_word(word: bytes) -> str:
    if word[:12] != _ADDRESS_PADDING:
        raise AbiDecodeError("an address word with non-zero padding")
    return "0x" + word[12:].hex()


@lru_cache(maxsize=65_536)
def _checksummed_address_word(word: bytes) -> str:
    """The checksummed address of ``word``, kept per word: one cached call instead of three
    for the addresses that recur in every log."""
    return checksum_address(_address_word(word))


def _bytes_word(word: bytes, size: int) -> bytes:
    if any(word[size:]):
        raise AbiDecodeError(f"a bytes{size} word with non-zero padding")
    return word[:size]


def _checksummed(reader: WordReader | None, kind: str) -> WordReader | None:
    """``reader``, checksumming what it reads when ``kind`` is an address."""
    if reader is None or kind != "address":
        return reader
    return _checksummed_address_word


def _eth_abi_reader(kind: str, what: str) -> WordReader:
    return lambda word: _decode([kind], word, what)[0]


def _decode(types: Sequence[str], data: bytes, what: str) -> tuple[Any, ...]:
    try:
        return tuple(decode(types, data))
    except DecodingError as error:
        raise AbiDecodeError(f"{what}: {error}") from None
