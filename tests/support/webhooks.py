"""Helpers of the webhooks tests: their settings, a subscription, subprocess servers in Trio."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from subprocess import Popen
from typing import Any

import httpx
import trio

from runtime.bootstrap import open_service
from tests.support.backends import redis_prefix
from tests.support.processes import server_process
from tests.support.server import make_settings, settings_env
from tests.support.wallet import sign_in

PLUGINS = ["auth", "webhooks", "billing", "chain"]


def webhook_env(var_dir: Path, database_url: str, *, plugins: list[str] | None = None,
                **overrides: Any) -> dict[str, str]:
    """A test service with the webhooks plugin: http to 127.0.0.1 allowed, fast retries.

    ``overrides`` are ``[plugins.webhooks]`` keys (``backoff_base_seconds=0.2``).
    """
    webhooks: dict[str, Any] = {
        "allow_http": "true", "allowed_hosts": ["127.0.0.1"], "backoff_base_seconds": 0.05,
        "timeout_seconds": 2, "lease_seconds": 5, "poll_seconds": 0.2, **overrides}
    extra = {f"FLOWSVC_PLUGINS_WEBHOOKS_{key.upper()}":
             json.dumps(value) if isinstance(value, list) else str(value)
             for key, value in webhooks.items()}
    return settings_env(var_dir, database_url=database_url, redis_prefix=redis_prefix(),
                        plugins=plugins or PLUGINS, extra=extra)


async def subscribe(http: httpx.AsyncClient, url: str, events: list[str] | None = None
                    ) -> dict[str, Any]:
    """Create a subscription; return the ``webhook`` object (with its secret)."""
    response = await http.post("/me/webhooks", json={"url": url, "events": events or []})
    assert response.status_code == 201, response.text
    webhook: dict[str, Any] = response.json()["webhook"]
    return webhook


async def deliveries(http: httpx.AsyncClient, webhook_id: str) -> list[dict[str, Any]]:
    response = await http.get(f"/me/webhooks/{webhook_id}/deliveries", params={"limit": 100})
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["deliveries"]
    return found


async def wait_until_settled(http: httpx.AsyncClient, webhook_id: str, count: int,
                             timeout: float = 15.0) -> list[dict[str, Any]]:
    """Wait until ``count`` deliveries of the webhook are delivered or failed; return all."""
    with trio.fail_after(timeout):
        while True:
            found = await deliveries(http, webhook_id)
            if sum(1 for item in found if item["state"] != "pending") >= count:
                return found
            await trio.sleep(0.05)


@asynccontextmanager
async def service_processes(env: dict[str, str], ports: list[int]
                            ) -> AsyncIterator[list[Popen[bytes]]]:
    """``server_process`` for each port, all started at once and stopped at the end, each in a
    worker thread so the test's Trio run (and its receivers) keep running meanwhile. Starting
    several at once needs the schema migrated beforehand (``migrate_schema``).
    """
    stacks = [ExitStack() for _ in ports]
    processes: dict[int, Popen[bytes]] = {}

    async def start(index: int) -> None:
        processes[index] = await trio.to_thread.run_sync(
            stacks[index].enter_context, server_process(env, ports[index]))

    try:
        async with trio.open_nursery() as nursery:
            for index in range(len(ports)):
                nursery.start_soon(start, index)
        yield [processes[index] for index in range(len(ports))]
    finally:
        for stack in stacks:
            await trio.to_thread.run_sync(stack.close)


@asynccontextmanager
async def service_process(env: dict[str, str], port: int) -> AsyncIterator[Popen[bytes]]:
    """One ``service_processes``."""
    async with service_processes(env, [port]) as [process]:
        yield process


async def migrate_schema(env: dict[str, str]) -> None:
    """Bring the schema of ``env``'s database up to date (before starting several processes)."""
    async with open_service(make_settings(env), migrate=True, environ=env):
        pass


async def signed_in(http: httpx.AsyncClient) -> int:
    """Sign in with a new wallet (the client keeps the session); return the user's id."""
    _, user = await sign_in(http)
    return int(str(user["id"]))
