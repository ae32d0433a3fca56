"""The ``[plugins.marketplace]`` settings table."""

from pydantic import Field

from runtime.config import Section


class MarketplaceSettings(Section):
    """Knobs of the marketplace; the ranking formulas themselves are fixed (docs/marketplace.md).

    :param cursor_ttl_seconds: how long a listing cursor stays usable; also how long the
        ranking history it relies on is kept.
    :param snapshot_lag_ms: how far behind "now" a new listing's score snapshot is taken, so
        that no ranking change still being committed can land inside it (agents published
        since are listed with their first score; see ``ranking.py``).
    :param scheduler_interval_seconds: how often subscriptions are renewed or ended and old
        ranking history is pruned.
    """

    cursor_ttl_seconds: int = Field(1800, ge=60)
    snapshot_lag_ms: int = Field(1000, ge=0, le=60_000)
    scheduler_interval_seconds: float = Field(60.0, gt=0)
