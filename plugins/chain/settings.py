"""The ``[plugins.chain]`` settings table (no keys yet: the token registry needs none)."""

from __future__ import annotations

from runtime.config import Section


class ChainSettings(Section):
    """On-chain reads and the token registry; ``docs/chain.md`` documents every key."""
