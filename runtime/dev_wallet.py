"""The development wallet of the embedded default: one key file, shared by ``flowsvc
dev-wallet`` (the auth plugin's command) and the console's one-click sign-in, so that both are
the same user.

Only for the embedded default (SQLite, no Redis, not production): ``available`` says so, and
both refuse elsewhere. Nothing here signs for a user of a real deployment.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.config import Settings

KEY_FILE = "dev-wallet.key"  # under the service's var_dir
DEV_TEMPLATE = "dpnm"  # the template of development tokens (nothing is deployed)


def available(settings: Settings) -> bool:
    """Whether this deployment is the embedded default (SQLite, no Redis, not production)."""
    return settings.embedded and settings.service.environment != "production"


def wallet_key(path: Path) -> str:
    """The development wallet's private key (hex), created on first use (mode 0600); a
    concurrent creator's key wins."""
    from eth_account import Account  # not at import: ``flowsvc --help`` stays light

    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass  # another run created it first: use that one
        else:
            with os.fdopen(fd, "w", encoding="ascii") as handle:
                handle.write("0x" + Account.create().key.hex().removeprefix("0x") + "\n")
    return path.read_text(encoding="ascii").strip()


def placeholder_instance(slug: str) -> str:
    """A stable made-up contract address for a development token (nothing is deployed)."""
    return "0x" + hashlib.sha256(f"flowsvc-dev-token:{slug}".encode()).hexdigest()[:40]
