"""The raw logs the indexer keeps, and the contracts it follows on a chain.

A log is kept as the node sent it (topics and data in hex), keyed by (chain, block hash, log
index): a log of a block dropped by a reorg never collides with the log at the same index of
the block that replaced it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from plugins.chain.abi import AbiDecodeError
from plugins.chain.contracts import DecodedEvent, decode_fields

ROLE_FACTORY = "factory"
ROLE_PROTOCOL = "protocol"
ROLE_TREE = "tree"
HASH_LENGTH = 66  # "0x" and 32 bytes in hex
LOG_COLUMNS = ("chain_id", "block_hash", "log_index", "block_number", "tx_hash", "address",
               "instance", "event", "account", "topics", "data")  # of ``chain_logs``


@dataclass(slots=True)
class RawLog:
    """One log as JSON-RPC gives it; addresses and hashes lowercase. Read-only by convention,
    not frozen: the indexer makes one per log, and a frozen dataclass's ``__init__`` cost a
    good part of what a log costs."""

    block_number: int
    block_hash: str
    log_index: int
    tx_hash: str
    address: str
    topics: tuple[str, ...]
    data: str
    _decoded: bool = field(default=False, init=False, repr=False, compare=False)
    _event: DecodedEvent | None = field(default=None, init=False, repr=False, compare=False)

    @classmethod
    def of(cls, log: Mapping[str, Any]) -> RawLog:
        """:raises AbiDecodeError: a pending log or fields that are not JSON-RPC's."""
        try:
            return cls(int(log["blockNumber"], 16), log["blockHash"].lower(),
                       int(log["logIndex"], 16), log["transactionHash"].lower(),
                       log["address"].lower(), tuple([topic.lower() for topic in log["topics"]]),
                       str(log["data"]))
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise AbiDecodeError(f"not a JSON-RPC log: {error!r}") from None

    @property
    def key(self) -> tuple[str, int]:
        return self.block_hash, self.log_index

    @property
    def order(self) -> tuple[int, int]:
        return self.block_number, self.log_index

    @property
    def event(self) -> DecodedEvent | None:
        """The event of an indexed interface, or None for a log that is none of them (a
        contract may emit events we do not read). Decoded once: decoding is most of what a
        log costs the indexer."""
        if not self._decoded:
            self._event = self._decode()
            self._decoded = True
        return self._event

    def _decode(self) -> DecodedEvent | None:
        if len(self.block_hash) != HASH_LENGTH or len(self.tx_hash) != HASH_LENGTH:
            return None
        try:
            return decode_fields(self.address, self.topics, self.data,
                                 block_number=self.block_number, block_hash=self.block_hash,
                                 transaction_hash=self.tx_hash, log_index=self.log_index)
        except AbiDecodeError:
            return None

    def account(self) -> str | None:
        """The first indexed argument read as an address (lowercase), if there is one."""
        return "0x" + self.topics[1][-40:] if len(self.topics) > 1 else None

    def row(self, chain_id: int, instance: str | None) -> tuple[object, ...]:
        """The log's row of ``chain_logs``, in ``LOG_COLUMNS`` order (``event`` is the
        decoded event's name, or ``unknown``)."""
        event = self.event
        topics = self.topics
        return (chain_id, self.block_hash, self.log_index, self.block_number, self.tx_hash,
                self.address, instance, "unknown" if event is None else event.name,
                "0x" + topics[1][-40:] if len(topics) > 1 else None,
                _topics_json(topics), self.data)

    @classmethod
    def from_row(cls, row: Any) -> RawLog:
        return cls(row.block_number, row.block_hash, row.log_index, row.tx_hash, row.address,
                   tuple(json.loads(row.topics)), row.data)


def _topics_json(topics: tuple[str, ...]) -> str:
    """``json.dumps(topics)``, written directly when the topics are plain ASCII letters and
    digits (0x hex, as nodes send them: nothing to escape); json.dumps cost as much as the
    rest of the row."""
    plain = "".join(topics)
    if plain.isascii() and plain.isalnum():
        return '["' + '", "'.join(topics) + '"]'
    return json.dumps(topics)


def unique_in_order(logs: Iterable[RawLog]) -> list[RawLog]:
    """``logs`` without repeats (two fetches may overlap), by block then log index."""
    return sorted({log.key: log for log in logs}.values(), key=lambda log: log.order)


@dataclass
class Followed:
    """The contracts followed on one chain: the factory, and the protocol and tree of each
    dpnm instance, each mapped to (instance, role). Grows as ``Launched`` logs are read."""

    factory: str
    by_address: dict[str, tuple[str | None, str]] = field(default_factory=dict)
    instances: set[str] = field(default_factory=set)

    def __post_init__(self) -> None:
        self.by_address[self.factory] = (None, ROLE_FACTORY)

    def add(self, instance: str, protocol: str, tree: str) -> list[str]:
        """Follow an instance's protocol and tree; return the addresses new to the set."""
        self.instances.add(instance)
        new = [address for address in (protocol, tree) if address not in self.by_address]
        self.by_address[protocol] = (instance, ROLE_PROTOCOL)
        self.by_address[tree] = (instance, ROLE_TREE)
        return new

    def addresses(self) -> list[str]:
        return sorted(self.by_address)

    def instance_of(self, address: str) -> str | None:
        return self.by_address.get(address, (None, ""))[0]
