"""The tier table and the pro-rating of upgrades: exact integers, rounded half up to a cent."""

from __future__ import annotations

import pytest

from plugins.billing.tiers import features, prorate
from runtime.wire import format_units

DAY = 86400
MONTH = 30 * DAY


def test_each_tier_unlocks_the_spec_features_and_the_ones_below() -> None:
    granted = {tier: {name for name, on in features(tier).items() if on}
               for tier in ("plus", "pro", "max", None)}
    assert granted == {
        "plus": {"priorityQueue"},
        "pro": {"priorityQueue", "premiumAgents", "fasterSse"},
        "max": {"priorityQueue", "premiumAgents", "fasterSse", "privateProjects",
                "dedicatedRuntime"},
        None: set()}


@pytest.mark.parametrize(("old", "new", "remaining", "micro_usd"), [
    ("plus", "pro", MONTH, 80_000_000),           # the whole period: the whole difference
    ("plus", "max", MONTH // 2, 90_000_000),      # half of 180 USD
    ("pro", "max", 10 * DAY, 33_330_000),         # 100 x 1/3 = 33.333... -> 33.33
    ("plus", "pro", 2 * DAY, 5_330_000),          # 80 x 2/30 = 5.3333... -> 5.33
    ("pro", "max", MONTH - 1, 100_000_000),       # 99.99996 -> 100.00
    ("plus", "pro", 161, 0),                      # 0.4969 cent -> 0: free
    ("plus", "pro", 162, 10_000),                 # exactly half a cent -> 0.01 (half up)
    ("plus", "pro", -5, 0),                       # past the period's end
])
def test_prorating_is_exact_and_rounds_half_up_to_the_cent(
        old: str, new: str, remaining: int, micro_usd: int) -> None:
    assert prorate(old, new, remaining, MONTH) == micro_usd


def test_token_amounts_are_exact_with_trailing_zeros_trimmed() -> None:
    assert format_units(20_012_345 * 10**12, 18) == "20.012345"
    assert format_units(200 * 10**18, 18) == "200"
    assert format_units(1, 18) == "0.000000000000000001"
