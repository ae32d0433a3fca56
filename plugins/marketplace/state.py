"""What the marketplace keeps per service: ``MARKETPLACE``, its settings.

Everything else it needs lives in its tables or comes from contracts (runs, projects, the
key meter), so the state is only the validated ``[plugins.marketplace]`` table, read once.
"""

from __future__ import annotations

from dataclasses import dataclass

from plugins.marketplace.settings import MarketplaceSettings
from runtime.service import Service, StateSlot


@dataclass(frozen=True)
class MarketplaceState:
    settings: MarketplaceSettings

    @classmethod
    def create(cls, service: Service) -> MarketplaceState:
        return cls(service.plugin_settings("marketplace", MarketplaceSettings))


MARKETPLACE: StateSlot[MarketplaceState] = StateSlot("marketplace", MarketplaceState.create)
