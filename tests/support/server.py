"""A real flowsvc server on a loopback port, in the test's own Trio run, and its settings."""

from __future__ import annotations

import json
import socket
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from pathlib import Path
from typing import Any

import httpx
import trio

from runtime.config import Settings, load_settings
from runtime.server import Running, run_server

ROOT = Path(__file__).resolve().parents[2]
INTERNAL_TOKEN = "test-internal-token-" + "i" * 32
INTERNAL = {"Authorization": f"Bearer {INTERNAL_TOKEN}"}


def settings_env(var_dir: Path, *, database_url: str, redis_url: str = "",
                 redis_prefix: str = "flowsvc-test:", plugins: list[str] | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that configures a test service (also used for subprocess servers)."""
    env = {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir),
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_SERVICE_SHUTDOWN_GRACE_SECONDS": "2",
        "FLOWSVC_SERVICE_DRAIN_SECONDS": "2",
        "FLOWSVC_DATABASE_URL": database_url,
        "FLOWSVC_REDIS_URL": redis_url,
        "FLOWSVC_REDIS_PREFIX": redis_prefix,
        "FLOWSVC_JWT_SECRET": "test-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": INTERNAL_TOKEN,
        "FLOWSVC_PLUGINS_ENABLED": json.dumps(plugins or ["auth"]),
    }
    env.update(extra or {})
    return env


def make_settings(env: dict[str, str]) -> Settings:
    """Settings from the defaults plus ``env`` only (the repo's config.toml is not read)."""
    return load_settings(None, environ=env)


@asynccontextmanager
async def running_server(settings: Settings, env: dict[str, str] | None = None
                         ) -> AsyncIterator[Running]:
    """Serve ``settings`` on 127.0.0.1 (a free port) until the block ends.

    :param env: the environment plugin settings are read from (default: the process's).
    """
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        running: Running = await nursery.start(_serve, settings, stop, env)
        try:
            yield running
        finally:
            stop.set()


async def _serve(settings: Settings, stop: trio.Event, env: dict[str, str] | None, *,
                 task_status: trio.TaskStatus[Running]) -> None:
    await run_server(settings, bind="127.0.0.1:0", handle_signals=False, stop=stop,
                     environ=env, task_status=task_status)


@cache
def tls_context() -> ssl.SSLContext:
    """One TLS context for the test clients of the process (``verify=tls_context()``): httpx
    makes one per client otherwise, parsing the system's CA file each time (20-40 ms of CPU
    a client), though the tests speak plain HTTP on loopback."""
    return httpx.create_ssl_context()


def client(running: Running, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=running.base_url, timeout=30, verify=tls_context(),
                             **kwargs)


# Every port ``free_port`` has handed out in this process. The kernel may give the same free
# port to two draws in a row (nothing holds it between them), and a test that starts two
# servers on the "two" ports would see one of them fail, or, for a Redis Cluster, lose a node.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A TCP port on 127.0.0.1, free a moment ago, never one this process was given before."""
    while True:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port: int = sock.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


def claim_port(port: int) -> bool:
    """Whether ``port`` on 127.0.0.1 is free now and was never handed out in this process;
    if so, it is handed out (``free_port`` will not return it)."""
    if port in _HANDED_OUT:
        return False
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    _HANDED_OUT.add(port)
    return True
