"""The tier table (spec, Limits), money in micro-USD and the pro-rating of upgrades.

Amounts are integers of micro-USD (10^-6 USD), written on the wire as decimal strings with
6 decimals, like FLOW amounts; card prices are whole cents.
"""

from __future__ import annotations

from typing import Final, Literal

from runtime.contracts.features import FEATURES, Feature
from runtime.wire import format_flow

Tier = Literal["plus", "pro", "max"]
TIERS: Final[tuple[Tier, ...]] = ("plus", "pro", "max")
MICRO_PER_CENT: Final = 10_000
PRICE_MICRO: Final[dict[str, int]] = {"plus": 20_000_000, "pro": 100_000_000,
                                      "max": 200_000_000}
_PLUS: Final[frozenset[Feature]] = frozenset({"priorityQueue"})
_PRO: Final[frozenset[Feature]] = _PLUS | {"premiumAgents", "fasterSse"}
_MAX: Final[frozenset[Feature]] = _PRO | {"privateProjects", "dedicatedRuntime"}
TIER_FEATURES: Final[dict[str, frozenset[Feature]]] = {"plus": _PLUS, "pro": _PRO, "max": _MAX}

format_usd = format_flow
"""Micro-USD as a decimal string with 6 decimals (``20000000`` -> ``"20.000000"``)."""


def features(tier: str | None) -> dict[str, bool]:
    """Every feature flag, true for those ``tier`` unlocks (all false for None)."""
    granted = TIER_FEATURES.get(tier or "", frozenset())
    return {name: name in granted for name in FEATURES}


def rank(tier: str) -> int:
    """0 for plus, 1 for pro, 2 for max: an upgrade goes up."""
    return TIERS.index(tier)


def prorate(old_tier: str, new_tier: str, remaining_seconds: int, period_seconds: int) -> int:
    """The price difference for the rest of a period, in micro-USD, rounded half up to a
    whole cent: ``(new - old) * remaining / period``, in integers, never floats.

    :param remaining_seconds: whole seconds left in the period (clamped to 0..period).
    """
    remaining = max(0, min(remaining_seconds, period_seconds))
    cents = (PRICE_MICRO[new_tier] - PRICE_MICRO[old_tier]) // MICRO_PER_CENT
    rounded = (2 * cents * remaining + period_seconds) // (2 * period_seconds)
    return rounded * MICRO_PER_CENT
