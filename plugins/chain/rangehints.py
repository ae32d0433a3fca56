"""Reading a provider's "eth_getLogs range too large / too many results" answer.

Every provider words this error its own way, and some say how large a range would have
worked. Indexers keep a list of patterns per provider (Ponder's is the most complete); this is
ours, written from the messages providers send. A pattern either names a span that should work
(``[0x..., 0x...]``), states the provider's maximum block range, or only says "too much" (the
caller then halves). Sizes are counted in blocks, both ends included: a stated "maximum range
5000" is read as 5000 blocks, which is safe whether the provider counts ``to - from`` or blocks.
"""

from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class RangeHint:
    """What a range error said.

    :param blocks: how many blocks to ask for next, or None when the provider gave no number.
    :param is_limit: True when ``blocks`` is the provider's stated maximum range (a limit worth
        remembering); False for a span suggested for this one query (it depends on how many
        logs the range holds, so a sparser range may allow more).
    """

    blocks: int | None
    is_limit: bool


# (provider, pattern): a pattern with ``{span}`` (groups ``start`` and ``end``) suggests a span
# for this query; one with ``{n}`` (a group ``size``) states the provider's limit; one with
# neither only detects the error. Earlier patterns win, so those carrying a number come first.
_PROVIDER_PATTERNS = (
    ("alchemy", r"this block range should work: {span}"),
    ("infura, zksync", r"try with this block range {span}"),
    ("quicknode, 1rpc, blast, blockpi", r"limited to (?:an? )?{n}(?: blocks?)? range"),
    ("geth-style, publicnode, hyperliquid", r"max(?:imum)? block range:? {n}"),
    ("moonbeam", r"block range is too wide \(maximum {n}\)"),
    ("generic", r"range (?:is )?too large, max(?:imum)?(?: is)? {n}"),
    ("avalanche", r"requested too many blocks from \d+ to \d+, maximum is set to {n}"),
    ("cloudflare", r"max range: {n}"),
    ("thirdweb", r"maximum allowed number of requested blocks is {n}"),
    ("coinbase", r"limit the query to at most {n} blocks"),
    ("blast paid", r"exceeds the range allowed for your plan \(\d+ > {n}\)"),
    ("swell", r"block range greater than {n} max"),
    ("somnia", r"block range exceeds {n}"),
    ("aurora", r"up to a {n} block range"),
    ("ankr tac", r"maximum \[from, to\] blocks distance: {n}"),
    ("infura, geth", r"query returned more than \d+ results"),
    ("ankr, blockpi", r"block range is too wide"),
    ("chainstack", r"block range limit exceeded"),
    ("llamarpc, ankr", r"query exceeds max results"),
    ("arbitrum", r"logs matched by query exceeds limit"),
    ("alchemy, 1rpc", r"response size (?:exceeded|should not greater than)"),
    ("optimism", r"backend response too large"),
    ("optimism, base", r"range (?:is )?too large"),
    ("generic", r"too many (?:results|logs)"),
)
# A number may have thousands separators ("10,000") and must end there: "2K" is not 2.
_NUMBER = r"(?P<size>\d(?:[\d,]*\d)?)(?!\w)"
_SPAN = r"\[(?P<start>0x[0-9a-f]+),\s*(?P<end>0x[0-9a-f]+)\]"
_PATTERNS = tuple(
    re.compile(pattern.replace("{n}", _NUMBER).replace("{span}", _SPAN), re.IGNORECASE)
    for _provider, pattern in _PROVIDER_PATTERNS)


def parse_range_hint(message: str) -> RangeHint | None:
    """Return what ``message`` says about the range, or None if it is not a range error.

    Raises nothing: an unknown message is simply not a range error.
    """
    for pattern in _PATTERNS:
        match = pattern.search(message)
        if match is None:
            continue
        groups = match.groupdict()
        if groups.get("start") is not None:
            blocks = int(groups["end"], 16) - int(groups["start"], 16) + 1
            return RangeHint(blocks if blocks >= 1 else None, is_limit=False)
        if groups.get("size") is not None:
            size = int(groups["size"].replace(",", ""))
            return RangeHint(size if size >= 1 else None, is_limit=size >= 1)
        return RangeHint(None, is_limit=False)
    return None
