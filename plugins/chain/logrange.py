"""The adaptive ``eth_getLogs`` range, as the best indexers do it (Ponder, rindexer,
graph-node, Subsquid): shrink fast on a provider's "range too large / too many results" answer
(to the range it suggests when it gives one, else by half), grow slowly on success, remember
what was learned per URL, let a configured cap win, and never retry one failing range forever.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio

from plugins.chain.endpoint import RpcEndpoint
from plugins.chain.rangehints import RangeHint
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import LogRangeTooLarge, RpcError, RpcTransientError

LogChunk = tuple[int, int, list[dict[str, Any]]]
Topics = Sequence[str | Sequence[str] | None]


class LogRangeStuck(RpcError):
    """A URL refused even a single block's logs ``max_failures_at_one`` times in a row: the
    range cannot be split further, so fetching stops instead of retrying it forever."""


# Successes in a row after which growth may again try the size last refused: a refusal for
# "too many results" depends on how dense the logs were, and they may have thinned out.
_PROBE_AFTER = 16


@dataclass
class _Learned:
    size: int
    limit: int | None = None  # the provider's stated maximum: a hard ceiling
    refused: int | None = None  # the smallest size refused lately: a soft ceiling
    successes: int = 0
    failures_at_one: int = 0


class LogRangeSizer:
    """How many blocks to ask each URL for, learned from its answers.

    :param initial: the first size for a URL, in blocks (both ends included).
    :param cap: a configured maximum that always wins over growth and suggestions.
    :param max_failures_at_one: range errors in a row at one block before giving up.
    :raises ValueError: a size or count below 1.
    """

    def __init__(self, *, initial: int = 500, cap: int | None = None,
                 max_failures_at_one: int = 3) -> None:
        if initial < 1 or (cap is not None and cap < 1) or max_failures_at_one < 1:
            raise ValueError("range sizes and the failure count must be at least 1")
        self.initial = initial
        self.cap = cap
        self.max_failures_at_one = max_failures_at_one
        self._learned: dict[str, _Learned] = {}

    def size(self, url: str) -> int:
        """Return how many blocks to ask ``url`` for next."""
        return self._state(url).size

    def limit(self, url: str) -> int | None:
        """Return the maximum range ``url``'s provider stated, once one of its errors said."""
        return self._state(url).limit

    def shrink(self, url: str, tried: int, hint: RangeHint) -> int:
        """Record that ``url`` refused a range of ``tried`` blocks; return the new size: the
        provider's suggestion when it is smaller than ``tried``, else half.

        :raises LogRangeStuck: the refused range was one block, ``max_failures_at_one`` times
            in a row.
        """
        state = self._state(url)
        if tried <= 1:
            state.failures_at_one += 1
            if state.failures_at_one >= self.max_failures_at_one:
                raise LogRangeStuck(f"{url} refused a single block's logs "
                                    f"{state.failures_at_one} times in a row")
        if hint.is_limit and hint.blocks is not None:
            # A stated limit at or above what just failed is counted another way than ours.
            stated = max(1, min(hint.blocks, tried - 1))
            state.limit = stated if state.limit is None else min(state.limit, stated)
        state.refused = tried if state.refused is None else min(state.refused, tried)
        state.successes = 0
        suggested = hint.blocks if hint.blocks is not None and hint.blocks < tried else None
        state.size = self._bounded(suggested or tried // 2, state)
        return state.size

    def grow(self, url: str, tried: int) -> int:
        """Record that ``url`` answered a range of ``tried`` blocks; return the new size: 5%
        more (at least one block), unless the range was cut short by its end, and below the
        size last refused until ``_PROBE_AFTER`` successes in a row."""
        state = self._state(url)
        state.failures_at_one = 0
        state.successes += 1
        if state.successes >= _PROBE_AFTER:
            state.refused = None
        if tried >= state.size:
            # x1.05 rounded, in integers: (size * 21 + 10) // 20.
            grown = max(state.size + 1, (state.size * 21 + 10) // 20)
            if state.refused is not None:
                grown = max(state.size, min(grown, state.refused - 1))
            state.size = self._bounded(grown, state)
        return state.size

    def _state(self, url: str) -> _Learned:
        state = self._learned.get(url)
        if state is None:
            state = self._learned[url] = _Learned(size=self.initial)
            state.size = self._bounded(self.initial, state)
        return state

    def _bounded(self, size: int, state: _Learned) -> int:
        for ceiling in (self.cap, state.limit):
            if ceiling is not None:
                size = min(size, ceiling)
        return max(1, size)


async def fetch_logs(pool: RpcPool, address: str | Sequence[str], topics: Topics,
                     from_block: int, to_block: int, sizer: LogRangeSizer, *,
                     chunk_timeout: float = 10.0) -> AsyncIterator[LogChunk]:
    """Walk ``from_block..to_block`` (both included) in chunks sized by ``sizer`` and yield
    ``(chunk_from, chunk_to, logs)`` in order: the chunks cover the range exactly once, with no
    gap and no overlap, whatever range errors happen on the way. Each chunk is asked of a URL
    whose head has reached the chunk's end (a node behind answers with no logs, not an error).
    ``to_block`` should be a block the chain has (the indexer passes its final head).

    :param address: a contract address or several; ``topics`` is the eth_getLogs topic filter.
    :param chunk_timeout: seconds each chunk may take, failover included.
    :raises RpcUnavailable: no URL answered a chunk in time; chunks yielded so far stand.
    :raises LogRangeStuck: a single block's logs are refused again and again.
    :raises RpcDeterministicError: the filter itself is wrong.
    """
    start = from_block
    while start <= to_block:
        attempt = partial(_fetch_chunk, sizer=sizer, address=address, topics=topics,
                          start=start, to_block=to_block)
        try:
            end, logs = await pool.run(attempt, deadline=trio.current_time() + chunk_timeout)
        except LogRangeTooLarge:
            continue  # the sizer has shrunk that URL's range: ask again
        yield start, end, logs
        start = end + 1


async def _fetch_chunk(endpoint: RpcEndpoint, deadline: float, *, sizer: LogRangeSizer,
                       address: str | Sequence[str], topics: Topics, start: int,
                       to_block: int) -> tuple[int, list[dict[str, Any]]]:
    end = min(to_block, start + sizer.size(endpoint.label) - 1)
    if endpoint.head_seen is None or endpoint.head_seen < end:
        await endpoint.head(min_final=end, deadline=deadline)
    log_filter = {"address": address if isinstance(address, str) else list(address),
                  "topics": [topic if topic is None or isinstance(topic, str) else list(topic)
                             for topic in topics],
                  "fromBlock": hex(start), "toBlock": hex(end)}
    try:
        logs = await endpoint.call_checked("eth_getLogs", [log_filter], _log_list,
                                           deadline=deadline)
    except LogRangeTooLarge as error:
        sizer.shrink(endpoint.label, end - start + 1, error.hint)
        raise
    sizer.grow(endpoint.label, end - start + 1)
    return end, logs


def _log_list(result: Any) -> list[dict[str, Any]]:
    if not isinstance(result, list) or not all(isinstance(log, dict) for log in result):
        raise RpcTransientError("eth_getLogs answered with something else than a list of logs",
                                outcome="bad_response")
    return result
