"""The adaptive eth_getLogs range: the sizer's arithmetic, then ``fetch_logs`` against fake
nodes that refuse ranges the way each provider does."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from plugins.chain.logrange import LogChunk, LogRangeSizer, LogRangeStuck, fetch_logs
from plugins.chain.rangehints import RangeHint
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import RpcUnavailable
from tests.plugins.chain.fake_node import Answer, FakeNode, serving, wider_than

HALVE = RangeHint(None, is_limit=False)


def test_sizes_start_at_the_initial_size_under_the_cap() -> None:
    assert LogRangeSizer().size("a") == 500
    assert LogRangeSizer(initial=500, cap=100).size("a") == 100


def test_shrink_halves_without_a_hint_and_never_goes_below_one() -> None:
    sizer = LogRangeSizer(initial=8, max_failures_at_one=10)
    assert [sizer.shrink("a", sizer.size("a"), HALVE) for _ in range(5)] == [4, 2, 1, 1, 1]


def test_shrink_takes_a_smaller_suggestion_and_halves_past_a_useless_one() -> None:
    sizer = LogRangeSizer(initial=1000)
    assert sizer.shrink("a", 1000, RangeHint(37, is_limit=False)) == 37
    assert sizer.limit("a") is None  # a suggestion for one query is no limit
    assert sizer.shrink("a", 37, RangeHint(37, is_limit=False)) == 18
    assert sizer.shrink("a", 18, RangeHint(5000, is_limit=False)) == 9


def test_a_stated_limit_is_remembered_and_caps_growth() -> None:
    sizer = LogRangeSizer(initial=5000)
    assert sizer.shrink("a", 5000, RangeHint(2000, is_limit=True)) == 2000
    assert sizer.limit("a") == 2000
    assert [sizer.grow("a", sizer.size("a")) for _ in range(3)] == [2000, 2000, 2000]
    # A limit the failing range did not exceed is counted another way: one block less.
    other = LogRangeSizer(initial=5000)
    assert other.shrink("b", 5000, RangeHint(5000, is_limit=True)) == 2500
    assert other.limit("b") == 4999


def test_growth_is_five_percent_rounded_and_at_least_one_block() -> None:
    sizer = LogRangeSizer(initial=1)
    sizes = [sizer.grow("a", sizer.size("a")) for _ in range(30)]
    assert sizes[:12] == [2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]
    big = LogRangeSizer(initial=500)
    assert [big.grow("a", big.size("a")) for _ in range(3)] == [525, 551, 579]


def test_growth_stays_below_a_refused_size_for_a_while_then_probes_again() -> None:
    sizer = LogRangeSizer(initial=40)
    assert sizer.shrink("a", 40, HALVE) == 20
    sizes = [sizer.grow("a", sizer.size("a")) for _ in range(16)]
    # Up to one block below the refused 40; the sixteenth success in a row lifts that.
    assert sizes == [*range(21, 31), 32, 34, 36, 38, 39, 41]


def test_a_chunk_cut_short_by_the_range_end_does_not_grow_the_size() -> None:
    sizer = LogRangeSizer(initial=100)
    assert sizer.grow("a", 40) == 100


def test_the_cap_always_wins() -> None:
    sizer = LogRangeSizer(initial=90, cap=100)
    assert [sizer.grow("a", sizer.size("a")) for _ in range(4)] == [95, 100, 100, 100]
    assert sizer.shrink("a", 100, RangeHint(None, is_limit=False)) == 50


def test_what_is_learned_is_kept_per_url() -> None:
    sizer = LogRangeSizer(initial=400)
    sizer.shrink("a", 400, RangeHint(10, is_limit=True))
    sizer.grow("b", 400)
    assert (sizer.size("a"), sizer.size("b")) == (10, 420)


def test_a_single_block_refused_again_and_again_stops() -> None:
    sizer = LogRangeSizer(initial=1, max_failures_at_one=3)
    sizer.shrink("a", 1, HALVE)
    sizer.shrink("a", 1, HALVE)
    sizer.grow("a", 1)  # a success in between: the count starts over
    sizer.shrink("a", 1, HALVE)
    sizer.shrink("a", 1, HALVE)
    with pytest.raises(LogRangeStuck, match="3 times in a row"):
        sizer.shrink("a", 1, HALVE)


@pytest.mark.parametrize("arguments", [{"initial": 0}, {"cap": 0}, {"max_failures_at_one": 0}])
def test_sizes_below_one_are_refused(arguments: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        LogRangeSizer(**arguments)


def error(code: int, message: str) -> dict[str, Any]:
    return {"code": code, "message": message}


LIMIT = 37
# How each provider refuses a range wider than LIMIT blocks.
STYLES: dict[str, Callable[[int, int], Any]] = {
    "alchemy": lambda start, end: error(-32602, "Log response size exceeded. Based on your "
                                        "parameters, this block range should work: "
                                        f"[{hex(start)}, {hex(start + LIMIT - 1)}]"),
    "infura": lambda start, end: error(-32005, "query returned more than 10000 results. Try "
                                       f"with this block range [{hex(start)}, "
                                       f"{hex(start + LIMIT - 1)}]."),
    "infura without a range": lambda start, end: error(
        -32005, "query returned more than 10000 results"),
    "quicknode": lambda start, end: error(-32614, f"eth_getLogs is limited to a {LIMIT} range"),
    "ankr": lambda start, end: error(-32600, "block range is too wide"),
    "bsc geth": lambda start, end: error(-32000, f"exceed maximum block range: {LIMIT}"),
    "generic": lambda start, end: error(-32000, f"range too large, max {LIMIT}"),
    "chainstack": lambda start, end: error(-32000, "Block range limit exceeded."),
}


async def collect(pool: RpcPool, start: int, end: int, sizer: LogRangeSizer) -> list[LogChunk]:
    return [chunk async for chunk in fetch_logs(pool, "0x" + "ab" * 20, [["0x" + "cd" * 32]],
                                                start, end, sizer)]


def assert_covers_exactly(chunks: list[LogChunk], start: int, end: int) -> None:
    assert chunks[0][0] == start and chunks[-1][1] == end
    for (_, previous_end, _), (next_start, _, _) in zip(chunks, chunks[1:], strict=False):
        assert next_start == previous_end + 1
    for chunk_start, chunk_end, logs in chunks:
        assert [int(log["blockNumber"], 16) for log in logs] == list(range(chunk_start,
                                                                           chunk_end + 1))


@pytest.mark.parametrize("style", STYLES)
async def test_fetch_logs_adapts_to_each_provider_and_covers_the_range_once(
        client: httpx.AsyncClient, style: str) -> None:
    node = FakeNode(refuses=wider_than(LIMIT), range_error=STYLES[style])
    async with serving(node):
        pool = RpcPool([node.url()], client)
        sizer = LogRangeSizer(initial=500)
        chunks = await collect(pool, 1000, 1999, sizer)
    assert_covers_exactly(chunks, 1000, 1999)
    refusals = sum(1 for body in node.requests if body.get("method") == "eth_getLogs") - len(
        chunks)
    # Shrinking is fast: a suggestion is taken at once, halving takes a few steps; growing
    # past the limit costs one refusal now and then.
    assert refusals <= 8 + len(chunks) // 10
    assert all(chunk_end - chunk_start + 1 <= LIMIT for chunk_start, chunk_end, _ in chunks)


async def test_random_refusals_never_leave_a_gap_or_an_overlap(
        client: httpx.AsyncClient) -> None:
    rng = random.Random(20261122)

    def refuses(start: int, end: int) -> bool:
        return end - start + 1 > 64 or (end - start >= 8 and rng.random() < 0.2)

    node = FakeNode(refuses=refuses, range_error=STYLES["infura without a range"])
    async with serving(node):
        chunks = await collect(RpcPool([node.url()], client), 0, 999, LogRangeSizer())
    assert_covers_exactly(chunks, 0, 999)
    assert len(node.requests) > len(chunks) + 10  # the refusals did happen


async def test_the_filter_carries_the_addresses_and_topics(client: httpx.AsyncClient) -> None:
    node = FakeNode()
    topics = [["0x" + "01" * 32, "0x" + "02" * 32], None, "0x" + "03" * 32]
    async with serving(node):
        pool = RpcPool([node.url()], client)
        chunks = [chunk async for chunk in fetch_logs(
            pool, ["0x" + "aa" * 20, "0x" + "bb" * 20], topics, 5, 7, LogRangeSizer())]
    assert [(start, end) for start, end, _ in chunks] == [(5, 7)]
    [log_filter] = node.requests[-1]["params"]
    assert log_filter == {"address": ["0x" + "aa" * 20, "0x" + "bb" * 20], "topics": topics,
                          "fromBlock": "0x5", "toBlock": "0x7"}


async def test_an_empty_range_fetches_nothing(client: httpx.AsyncClient) -> None:
    node = FakeNode()
    async with serving(node):
        assert await collect(RpcPool([node.url()], client), 10, 9, LogRangeSizer()) == []
    assert node.requests == []


async def test_a_single_block_refused_again_and_again_raises(client: httpx.AsyncClient) -> None:
    node = FakeNode(refuses=lambda start, end: True, range_error=STYLES["ankr"])
    async with serving(node):
        with pytest.raises(LogRangeStuck):
            await collect(RpcPool([node.url()], client), 0, 100,
                          LogRangeSizer(initial=8, max_failures_at_one=3))
    assert node.methods() == ["eth_blockNumber"] + ["eth_getLogs"] * 6  # 8, 4, 2, 1, 1, 1


async def test_a_lagging_url_is_not_asked_for_blocks_it_lacks(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    lagging, synced = FakeNode(head=50), FakeNode(head=5000)
    async with serving(lagging, synced):
        pool = RpcPool([lagging.url(), synced.url()], client)
        chunks = await collect(pool, 0, 999, LogRangeSizer(initial=500))
    assert_covers_exactly(chunks, 0, 999)
    assert lagging.methods() == ["eth_blockNumber"]
    assert synced.methods() == ["eth_blockNumber", "eth_getLogs", "eth_getLogs"]


async def test_learned_sizes_follow_the_url_that_answers(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    narrow = FakeNode(refuses=wider_than(10), range_error=lambda start, end: error(
        -32000, "exceed maximum block range: 10"))
    wide = FakeNode()
    narrow.script = [Answer(), Answer(), Answer(), Answer(status=503)]
    async with serving(narrow, wide):
        sizer = LogRangeSizer(initial=100)
        pool = RpcPool([narrow.url(), wide.url()], client)
        chunks = await collect(pool, 0, 299, sizer)
    assert_covers_exactly(chunks, 0, 299)
    # narrow: head, a refusal at 100, one chunk of 10, then a 503: wide takes over at its size.
    assert [(start, end) for start, end, _ in chunks][:3] == [(0, 9), (10, 109), (110, 214)]
    assert (sizer.size(pool.endpoints[0].label), sizer.limit(pool.endpoints[0].label)) == (10, 10)


async def test_an_unavailable_chain_stops_the_walk_after_the_chunks_already_yielded(
        client: httpx.AsyncClient) -> None:
    node = FakeNode()
    node.script = [Answer(), Answer(), Answer(status=500)]
    yielded: list[LogChunk] = []
    async with serving(node):
        with pytest.raises(RpcUnavailable):
            async for chunk in fetch_logs(RpcPool([node.url()], client), "0x" + "ab" * 20, [],
                                          0, 999, LogRangeSizer(initial=100)):
                yielded.append(chunk)
    assert [(start, end) for start, end, _ in yielded] == [(0, 99)]


async def test_a_chunk_gets_its_own_deadline(client: httpx.AsyncClient) -> None:
    node = FakeNode()
    node.script = [Answer(), Answer(delay=60)]
    async with serving(node):
        pool = RpcPool([node.url()], client, attempt_timeout=30)
        with trio.fail_after(20), pytest.raises(RpcUnavailable, match="deadline"):
            async for _chunk in fetch_logs(pool, "0x" + "ab" * 20, [], 0, 10, LogRangeSizer(),
                                           chunk_timeout=0.5):
                pass
