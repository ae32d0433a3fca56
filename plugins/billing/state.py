"""What the billing plugin keeps per service: ``BILLING`` (settings, the clock, providers)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from plugins.billing.clock import Clock, SystemClock, TestClock
from plugins.billing.providers import Provider
from plugins.billing.providers.crypto_bot import CryptoBot
from plugins.billing.providers.gateway import Gateway
from plugins.billing.providers.usdt_bep20 import UsdtBep20
from plugins.billing.settings import BillingSettings
from runtime.config import ConfigError
from runtime.service import Service, StateSlot


def configured_providers(settings: BillingSettings, public_url: str) -> dict[str, Provider]:
    """The providers whose settings are complete, by their name on the wire."""
    providers: dict[str, Provider] = {}
    timeout = settings.provider_timeout_seconds
    if settings.crypto_bot_base_url and settings.crypto_bot_token:
        providers[CryptoBot.name] = CryptoBot(settings.crypto_bot_base_url,
                                              settings.crypto_bot_token,
                                              settings.crypto_bot_accepted_assets, timeout)
    if settings.gateway_base_url and settings.gateway_secret_key \
            and settings.gateway_webhook_secret:
        providers[Gateway.name] = Gateway(settings.gateway_base_url, settings.gateway_secret_key,
                                          settings.gateway_webhook_secret,
                                          settings.return_url or public_url.rstrip("/"), timeout)
    if settings.usdt_token and settings.usdt_treasury:
        providers[UsdtBep20.name] = UsdtBep20(settings.usdt_chain_id, settings.usdt_token,
                                              settings.usdt_treasury, settings.usdt_decimals)
    return providers


@dataclass(frozen=True)
class BillingState:
    settings: BillingSettings
    clock: Clock
    providers: dict[str, Provider]

    @classmethod
    def create(cls, service: Service) -> BillingState:
        """:raises ConfigError: ``test_clock`` in a ``production`` deployment."""
        settings = service.plugin_settings("billing", BillingSettings)
        if settings.test_clock and service.settings.service.environment == "production":
            raise ConfigError("[plugins.billing] test_clock = true is refused when "
                              "[service] environment is \"production\"")
        clock: Clock = TestClock() if settings.test_clock else SystemClock()
        return cls(settings, clock,
                   configured_providers(settings, service.settings.service.public_url))

    @property
    def period(self) -> timedelta:
        """The length of a billing period (``period_days``)."""
        return timedelta(days=self.settings.period_days)

    def off_session(self, provider: str) -> bool:
        """Whether renewals through ``provider`` are charged without the user."""
        known = self.providers.get(provider)
        return known is not None and known.off_session

    def token_decimals(self, provider: str) -> int | None:
        """The token's decimals for ``usdt_bep20`` invoices (which reserve an amount)."""
        known = self.providers.get(provider)
        return known.decimals if isinstance(known, UsdtBep20) else None

    def due_at(self, renews_at: datetime, provider: str) -> datetime:
        """When the scheduler acts on an active subscription renewing at ``renews_at``: then
        for off-session providers, ``renewal_notice_hours`` before (to send the renewal
        invoice) for the others."""
        if self.off_session(provider):
            return renews_at
        return renews_at - timedelta(hours=self.settings.renewal_notice_hours)


BILLING: StateSlot[BillingState] = StateSlot("billing", BillingState.create)
