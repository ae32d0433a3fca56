"""The ``[plugins.keys]`` settings table (``docs/keys.md`` explains each key)."""

from pydantic import Field

from runtime.config import Section


class KeysSettings(Section):
    max_keys_per_user: int = Field(100, ge=1)
    max_rate_limit_rpm: int = Field(100_000, ge=1)
    cache_size: int = Field(10_000, ge=16)
    cache_ttl_seconds: float = Field(300.0, gt=0)
    invalidation_poll_seconds: float = Field(1.0, gt=0)
    meter_timeout_seconds: float = Field(2.0, gt=0)
    meter_max_batch: int = Field(256, ge=1)
    spend_flush_seconds: float = Field(1.0, gt=0)
    usage_buffer: int = Field(10_000, ge=1)
    usage_batch: int = Field(500, ge=1)
    usage_flush_seconds: float = Field(0.5, gt=0)
    usage_retention_days: int = Field(90, ge=1)
    charge_grace_seconds: float = Field(300.0, gt=0)
    charge_reconcile_seconds: float = Field(60.0, gt=0)
    recent_default_limit: int = Field(50, ge=1, le=200)
