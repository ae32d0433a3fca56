"""The ``[plugins.billing]`` settings table (``docs/billing.md`` explains each key).

A provider is enabled only when its keys are set: ``crypto_bot`` needs a base URL and an app
token, ``gateway`` a base URL, a secret key and a webhook secret, ``usdt_bep20`` the USDT
contract and a treasury address. With none set (the default) checkout answers
``provider_unsupported`` and everything else works.
"""

from __future__ import annotations

from pydantic import Field, field_validator

from runtime.config import Section

ADDRESS = r"^(0x[0-9a-fA-F]{40})?$"


class BillingSettings(Section):
    period_days: int = Field(30, ge=1, le=366)
    checkout_expiry_minutes: int = Field(60, ge=1, le=10_080)
    renewal_notice_hours: int = Field(24, ge=0, le=240)
    scheduler_poll_seconds: float = Field(60.0, gt=0)
    lease_seconds: float = Field(120.0, gt=0)
    provider_timeout_seconds: float = Field(10.0, gt=0)
    return_url: str = ""
    # Development and test deployments only: the internal clock endpoint may move time.
    test_clock: bool = False
    crypto_bot_base_url: str = ""
    crypto_bot_token: str = ""
    crypto_bot_accepted_assets: str = ""
    gateway_base_url: str = ""
    gateway_secret_key: str = ""
    gateway_webhook_secret: str = ""
    usdt_chain_id: int = Field(56, ge=1)
    usdt_token: str = Field("", pattern=ADDRESS)
    usdt_treasury: str = Field("", pattern=ADDRESS)
    usdt_decimals: int = Field(18, ge=6, le=36)
    usdt_quarantine_hours: int = Field(72, ge=0)

    @field_validator("crypto_bot_base_url", "gateway_base_url", "return_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if value and not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https:// (or be empty)")
        return value.rstrip("/")

    @field_validator("usdt_token", "usdt_treasury")
    @classmethod
    def _lowercase(cls, value: str) -> str:
        return value.lower()
