"""Reads batched into Multicall3 ``aggregate3`` calls, each answer pinned to one block.

A ``Batch`` collects typed views (``plugins.chain.views``) to send as ONE ``eth_call`` to
Multicall3 (``reads.ChainReads.latest``, or ``send_all`` pinned to a block). Every batch also
asks Multicall3 itself for ``getBlockNumber()`` and ``getCurrentBlockTimestamp()``: they run
inside the same call, so the answer says exactly which block every read of it saw, and "now"
for time-dependent figures (days left, the daily window) is that block's time, not the
server's clock. A batch sent at ``latest`` (one RPC request, no ``eth_blockNumber`` first)
learns its block this way; the follow-up batches of a tree walk are then sent pinned to that
block number, so a whole answer sees one state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from plugins.chain.abi import (
    WORD,
    AbiDecodeError,
    Interface,
    WordReader,
    hex_bytes,
    read_words,
    word_reader,
)
from plugins.chain.rpc import RpcPool
from plugins.chain.views import Call3, View, aggregate3_call_data

T = TypeVar("T")

# The canonical Multicall3 (and the reference one of the tests) answers these two as well.
_MULTICALL3_CLOCK = Interface.of(
    "Multicall3Clock",
    "function getBlockNumber() returns (uint256)",
    "function getCurrentBlockTimestamp() returns (uint256)",
)
BLOCK_NUMBER = View(_MULTICALL3_CLOCK.functions["getBlockNumber"],
                    lambda values: int(values[0]))
BLOCK_TIMESTAMP = View(_MULTICALL3_CLOCK.functions["getCurrentBlockTimestamp"],
                       lambda values: int(values[0]))

# Calls per aggregate3: a getChild costs a few thousand gas inside Multicall3, and nodes cap
# an eth_call's gas (geth and anvil at the block gas limit, 30M or more by default).
MAX_CALLS_PER_AGGREGATE = 1000


# Every answer of a request is decoded on the request's path: the answers made only of
# 32-byte words (uints, bools, addresses) are read by ``abi.read_words`` and the aggregate3
# envelope by hand below, with eth_abi's checks (tests/plugins/chain/test_onchain_codec.py
# compares both with eth_abi).


@dataclass(frozen=True)
class Slot(Generic[T]):
    """Where one view's answer sits in a batch's answers."""

    index: int
    view: View[T]
    words: tuple[WordReader, ...] | None  # the readers of an all-word answer

    def of(self, answers: Answers) -> T:
        """The decoded answer. Raises ``AbiDecodeError`` (no code at the target, say)."""
        data = answers.data[self.index]
        if self.words is None:
            return self.view.decode(data)
        return self.view.convert(read_words(self.words, data, self.view.function.name))


@dataclass(frozen=True)
class Answers:
    """What one batch returned: the block it saw, that block's time, each call's data."""

    block: int
    timestamp: int
    data: Sequence[bytes]


class Batch:
    """Views to read in one ``aggregate3`` call. A failing view fails the whole call (no
    ``allowFailure``): an answer is complete or not given.

    :param multicall: the chain's Multicall3 address.
    """

    def __init__(self, multicall: str) -> None:
        self.multicall = multicall
        self.calls: list[Call3] = []
        self._data: str | None = None  # the encoded calls, kept: a batch may be sent again
        self.add(BLOCK_NUMBER, multicall)
        self.add(BLOCK_TIMESTAMP, multicall)

    def add(self, view: View[T], target: str, *args: Any) -> Slot[T]:
        """Add ``view(*args)`` on ``target``; its answer is read with the returned slot."""
        self.calls.append(view.call3(target, *args, allow_failure=False))
        self._data = None
        readers = [word_reader(output["type"]) for output in view.function.abi["outputs"]]
        words = None if None in readers else tuple(
            reader for reader in readers if reader is not None)
        return Slot(len(self.calls) - 1, view, words)

    def params(self, block: int | None) -> list[Any]:
        """The ``eth_call`` parameters: at ``block``, or at ``latest`` when None."""
        if self._data is None:
            self._data = "0x" + aggregate3_call_data(self.calls).hex()
        return [{"to": self.multicall, "data": self._data},
                "latest" if block is None else hex(block)]

    def answers(self, result: Any) -> Answers:
        """Split an ``eth_call`` result of this batch. Raises ``AbiDecodeError``."""
        data = split_aggregate3(hex_bytes(result))
        if len(data) != len(self.calls):
            raise AbiDecodeError(f"{len(self.calls)} calls, {len(data)} answers")
        if len(data[0]) != WORD or len(data[1]) != WORD:
            raise AbiDecodeError("Multicall3 did not answer its block number and time")
        return Answers(int.from_bytes(data[0], "big"), int.from_bytes(data[1], "big"), data)


def split_aggregate3(data: bytes) -> list[bytes]:
    """The return data of each call of an ``aggregate3`` answer (what ``decode_aggregate3``
    gives, read by hand). A call that failed cannot be in it: the batches allow none.

    :raises AbiDecodeError: offsets or lengths that point outside ``data``, a failed call.
    """
    def word(at: int) -> int:
        if at < 0 or at + WORD > len(data):
            raise AbiDecodeError(f"aggregate3 answer: word at {at} of {len(data)} bytes")
        return int.from_bytes(data[at:at + WORD], "big")

    array = word(0)
    count = word(array)
    heads = array + WORD
    returned = []
    for index in range(count):
        item = heads + word(heads + WORD * index)
        if word(item) != 1:
            raise AbiDecodeError(f"aggregate3 answer: call {index} failed")
        start = item + word(item + WORD)
        length = word(start)
        if start + WORD + length > len(data):
            raise AbiDecodeError(f"aggregate3 answer: call {index} overruns the data")
        returned.append(data[start + WORD:start + WORD + length])
    return returned


async def send_all(pool: RpcPool, batches: Sequence[Batch], *, block: int,
                   deadline: float) -> list[Answers]:
    """Send ``batches`` pinned to ``block`` in one JSON-RPC batch request (one HTTP round trip).

    :raises RpcError: from the pool, or the first call that failed.
    :raises AbiDecodeError: an answer that does not decode, or one that saw another block
        (a node that cannot serve ``block`` answers for another: never mix states).
    """
    results = await pool.batch([("eth_call", batch.params(block)) for batch in batches],
                               deadline=deadline)
    answers = [batch.answers(result.unwrap()) for batch, result in zip(batches, results,
                                                                        strict=True)]
    for answer in answers:
        if answer.block != block:
            raise AbiDecodeError(f"asked for block {block}, the node answered {answer.block}")
    return answers
