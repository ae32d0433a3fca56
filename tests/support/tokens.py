"""Helpers for the token registry (the chain plugin) and the tests of what attaches to it."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from runtime.server import Running
from tests.support.backends import redis_prefix
from tests.support.server import (
    INTERNAL,
    make_settings,
    running_server,
    settings_env,
    tls_context,
)


def chain_env(var_dir: Path, database_url: str) -> dict[str, str]:
    """A test service with the auth and chain plugins (the registry without projects);
    the request limits are lifted."""
    return settings_env(var_dir, database_url=database_url, redis_prefix=redis_prefix(),
                        plugins=["auth", "chain"],
                        extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0",
                               "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                               "FLOWSVC_LIMITS_INTERNAL_RPM": "0"})


@asynccontextmanager
async def serve_chain(var_dir: Path, database_url: str) -> AsyncIterator[Running]:
    """A running service configured by ``chain_env``."""
    env = chain_env(var_dir, database_url)
    async with running_server(make_settings(env), env) as running:
        yield running


async def add_token(base_url: str, slug: str, owner: str, *,
                    instance: str | None = None) -> httpx.Response:
    """Register a token through the internal endpoint of the service at ``base_url`` (with
    a client of its own: a session cookie would take precedence over the internal token)."""
    async with httpx.AsyncClient(base_url=base_url, timeout=30, verify=tls_context()) as internal:
        return await internal.put(f"/internal/tokens/{slug}", headers=INTERNAL, json={
            "ownerAddress": owner, "template": "dpnm", "chainId": 56,
            "instance": instance or "0x" + (slug.encode().hex() * 40)[:40]})
