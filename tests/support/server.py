"""A real flowsvc server on a loopback port, in the test's own Trio run, and its settings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import trio

from runtime.config import Settings, load_settings
from runtime.server import Running, run_server

ROOT = Path(__file__).resolve().parents[2]


def settings_env(var_dir: Path, *, database_url: str, redis_url: str = "",
                 redis_prefix: str = "flowsvc-test:", plugins: list[str] | None = None,
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment that configures a test service (also used for subprocess servers)."""
    env = {
        "FLOWSVC_SERVICE_VAR_DIR": str(var_dir),
        "FLOWSVC_SERVICE_COOKIE_SECURE": "false",
        "FLOWSVC_SERVICE_SHUTDOWN_GRACE_SECONDS": "2",
        "FLOWSVC_DATABASE_URL": database_url,
        "FLOWSVC_REDIS_URL": redis_url,
        "FLOWSVC_REDIS_PREFIX": redis_prefix,
        "FLOWSVC_JWT_SECRET": "test-jwt-secret-" + "x" * 32,
        "FLOWSVC_INTERNAL_TOKEN": "test-internal-token",
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


def client(running: Running, **kwargs: Any) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=running.base_url, timeout=30, **kwargs)


@contextmanager
def server_process(env: dict[str, str], port: int, *args: str) -> Iterator[subprocess.Popen[bytes]]:
    """``flowsvc serve`` in its own process on ``port``; stopped with SIGTERM at the end."""
    process = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "--config", os.devnull, "serve",
         "--bind", f"127.0.0.1:{port}", *args],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        _wait_ready(process, port)
        yield process
    finally:
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if process.stdout is not None:
            process.stdout.close()  # unclosed, it is a ResourceWarning (an error in tests)


def _wait_ready(process: subprocess.Popen[bytes], port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = process.stdout.read().decode() if process.stdout else ""
            raise RuntimeError(f"server exited with {process.returncode}:\n{output[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server on port {port} did not become ready in {timeout} s")


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port
