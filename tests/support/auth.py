"""Helpers of the auth tests: a server with extra settings, and signed messenger ``initData``.

``init_data`` is written from the platform's published algorithm, independently of
``plugins.auth.messenger``, so that a test of the plugin is not the plugin checking itself:
secret_key = HMAC-SHA256(key="WebAppData", msg=bot_token); hash = hex HMAC-SHA256(key=
secret_key, msg=data-check string), the data-check string being every field but ``hash``,
sorted by key, as ``key=value`` lines.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from runtime.server import Running
from tests.support.backends import redis_prefix
from tests.support.server import make_settings, running_server, settings_env

BOT_TOKEN = "123456789:test-bot-token-AAAAAAAAAAAAAAAAAAAAAAAAAAAA"


@asynccontextmanager
async def auth_server(var_dir: Path, database_url: str, **extra: str) -> AsyncIterator[Running]:
    """A running service with the auth plugin and ``extra`` settings (env names to values)."""
    env = settings_env(var_dir, database_url=database_url, redis_prefix=redis_prefix(),
                       extra=extra)
    async with running_server(make_settings(env), env) as running:
        yield running


def init_data(user: dict[str, Any] | str, *, bot_token: str = BOT_TOKEN,
              auth_date: int | str | None = None, tamper: bool = False) -> str:
    """The URL-encoded ``initData`` a WebApp would receive for ``user`` (a JSON text is
    signed as it is: hostile ones).

    :param auth_date: Unix seconds of the login (default: now).
    :param tamper: change a signed field after signing (the hash no longer matches).
    """
    fields = {
        "query_id": "AAHdF6IQAAAAAN0XohDhrOrc",
        "user": user if isinstance(user, str) else json.dumps(user, separators=(",", ":")),
        "auth_date": str(int(time.time()) if auth_date is None else auth_date),
    }
    check = "\n".join(f"{key}={fields[key]}" for key in sorted(fields))
    secret_key = hmac.new(b"WebAppData", bot_token.encode(), hashlib.sha256).digest()
    fields["hash"] = hmac.new(secret_key, check.encode(), hashlib.sha256).hexdigest()
    if tamper:
        assert isinstance(user, dict), "tamper changes the id of a user given as a dict"
        fields["user"] = fields["user"].replace(str(user["id"]), str(user["id"] + 1))
    return urlencode(fields)
