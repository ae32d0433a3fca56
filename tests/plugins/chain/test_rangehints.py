"""Every provider's wording of "eth_getLogs range too large", and what it says will work."""

from __future__ import annotations

import pytest

from plugins.chain.rangehints import RangeHint, parse_range_hint

SUGGESTED = [
    # Alchemy: a span that should work for this query (0x10..0x1f is 16 blocks).
    ("Log response size exceeded. You can make eth_getLogs requests with up to a 2K block "
     "range and no limit on the response size, or you can request any block range with a cap "
     "of 10K logs in the response. Based on your parameters, this block range should work: "
     "[0x10, 0x1f]", 16),
    ("query returned more than 10000 results. Try with this block range [0x3E8, 0x4AF].", 200),
]
LIMITS = [
    ("eth_getLogs is limited to a 10,000 range", 10_000),  # QuickNode
    ("eth_getLogs is limited to 1024 block range", 1024),  # BlockPI
    ("exceed maximum block range: 5000", 5000),  # BSC public nodes, geth style
    ("maximum block range: 50000", 50_000),  # PublicNode
    ("query exceeds max block range 1000", 1000),
    ("range too large, max 2000", 2000),
    ("block range too large, max is 3,000 blocks", 3000),
    ("block range is too wide (maximum 1024)", 1024),  # Moonbeam
    ("requested too many blocks from 100 to 20000, maximum is set to 2048", 2048),  # Avalanche
    ("Max range: 800", 800),  # Cloudflare
    ("Maximum allowed number of requested blocks is 1000", 1000),  # thirdweb
    ("please limit the query to at most 1000 blocks", 1000),  # Coinbase
    ("block range exceeds the range allowed for your plan (5000 > 500)", 500),  # Blast paid
    ("block range greater than 10000 max", 10_000),
    ("block range exceeds 1000", 1000),
    ("you can make eth_getLogs requests with up to a 2000 block range", 2000),  # Aurora
    ("maximum [from, to] blocks distance: 3000", 3000),  # Ankr on some chains
]
NO_NUMBER = [
    "query returned more than 10000 results",  # Infura, geth
    "block range is too wide",  # Ankr
    "Block range limit exceeded.",  # Chainstack
    "query exceeds max results 20000",
    "logs matched by query exceeds limit of 10000",  # Arbitrum
    "Log response size exceeded.",  # Alchemy without a suggestion
    "response size should not greater than 10000000 bytes",  # 1RPC
    "backend response too large",  # Optimism
    "Block range is too large",  # Optimism, Base
    "too many logs",
]
NOT_RANGE = [
    "execution reverted",
    "rate limited to 25 requests per second",
    "header not found",
    "up to a 2K block range",  # "2K" is not the number 2
    "",
]


@pytest.mark.parametrize(("message", "blocks"), SUGGESTED)
def test_a_suggested_span_is_read_as_its_block_count(message: str, blocks: int) -> None:
    assert parse_range_hint(message) == RangeHint(blocks, is_limit=False)


@pytest.mark.parametrize(("message", "blocks"), LIMITS)
def test_a_stated_limit_is_read_as_a_limit(message: str, blocks: int) -> None:
    assert parse_range_hint(message) == RangeHint(blocks, is_limit=True)


@pytest.mark.parametrize("message", NO_NUMBER)
def test_a_range_error_without_a_number_asks_to_halve(message: str) -> None:
    assert parse_range_hint(message) == RangeHint(None, is_limit=False)


@pytest.mark.parametrize("message", NOT_RANGE)
def test_other_messages_are_not_range_errors(message: str) -> None:
    assert parse_range_hint(message) is None


def test_an_empty_or_backwards_span_suggests_nothing() -> None:
    assert parse_range_hint("this block range should work: [0x20, 0x10]") == RangeHint(
        None, is_limit=False)
    assert parse_range_hint("range too large, max 0") == RangeHint(None, is_limit=False)
