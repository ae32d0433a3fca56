"""What kind of deployment the console runs in (pages offer the development wallet on the
embedded default only)."""

from __future__ import annotations

from runtime.dev_wallet import available
from runtime.http import current_service


def dev_wallet_available() -> bool:
    """Whether this is the embedded default (SQLite, no Redis, not production)."""
    return available(current_service().settings)
