"""Helpers for API-key tests: backends paired as deployed, a signed-in user with a key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.backends import POSTGRES_URL, REDIS_URL, redis_prefix
from tests.support.server import settings_env

# The two deployments the keys plugin is built for: embedded, and scale-out.
KEY_BACKENDS = ["sqlite-memory"] + (["postgres-redis"] if POSTGRES_URL and REDIS_URL else [])


def keys_env(var_dir: Path, database_url: str, redis_url: str, *,
             pricing: dict[str, str] | None = None, prefix: str | None = None,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    """Settings of a service with the auth and keys plugins (and ``[pricing]``)."""
    values = {"FLOWSVC_PRICING": json.dumps(pricing or {})}
    values.update(extra or {})
    return settings_env(var_dir, database_url=database_url, redis_url=redis_url,
                        redis_prefix=prefix or redis_prefix(), plugins=["auth", "keys"],
                        extra=values)


async def create_key(http: httpx.AsyncClient, **fields: Any) -> dict[str, Any]:
    """Create a key with the client's credentials; the created record with ``raw_key``."""
    response = await http.post("/me/api-keys", json={"name": "test key", **fields})
    assert response.status_code == 201, response.text
    key: dict[str, Any] = response.json()["key"]
    return key


async def wait_for_calls(http: httpx.AsyncClient, key_id: str, count: int,
                         timeout: float = 10.0) -> list[dict[str, Any]]:
    """The key's recent calls once the usage log holds ``count`` of them (it is batched)."""
    with trio.fail_after(timeout):
        while True:
            response = await http.get(f"/me/api-keys/{key_id}/recent", params={"limit": 200})
            assert response.status_code == 200, response.text
            calls: list[dict[str, Any]] = response.json()["calls"]
            if len(calls) >= count:
                return calls
            await trio.sleep(0.1)
