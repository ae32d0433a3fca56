"""What kind of deployment the console runs in (pages offer the development wallet on the
embedded default only)."""

from __future__ import annotations

from runtime.http import current_service


def dev_wallet_available() -> bool:
    """Whether this is the embedded default (SQLite, no Redis, not production)."""
    settings = current_service().settings
    return settings.embedded and settings.service.environment != "production"
