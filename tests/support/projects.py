"""Helpers for the projects plugin's tests: a service with the plugin, token owners, projects."""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from sqlalchemy import Connection

from runtime.events import OutboundEvent
from runtime.hookspecs import hookimpl
from runtime.server import Running
from runtime.service import Service
from tests.support.backends import redis_prefix
from tests.support.server import (
    ROOT,
    client,
    make_settings,
    running_server,
    settings_env,
    tls_context,
)
from tests.support.sse import SseEvent, open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in

BRIEF = ("Build a pizza ordering site for Luigi's. Customers pick toppings and pay online. "
         "Orders show up on a kitchen screen.")


def host_env(tmp_path: Path, name: str, database_url: str, redis_url: str, model_url: str,
             prefix: str, *, projects: dict[str, str] | None = None,
             extra: dict[str, str] | None = None) -> dict[str, str]:
    """One "host" of a multi-host test: its own var directory and workspace root under
    ``tmp_path / name``, the shared database and Redis, the projects plugin on the fake model
    at ``model_url`` and webhooks to loopback; ``projects`` and ``extra`` add settings."""
    project_settings = {"BACKEND": "openai", "MODEL_BASE_URL": model_url, "MODEL": "fake-model",
                        "MODEL_API_KEY": "sk-fake",
                        "WORKSPACE_ROOT": str(tmp_path / name / "workspaces"), **(projects or {})}
    webhooks = {"ALLOW_HTTP": "true", "ALLOWED_HOSTS": '["127.0.0.1"]',
                "BACKOFF_BASE_SECONDS": "0.05", "TIMEOUT_SECONDS": "2", "POLL_SECONDS": "0.2"}
    settings = {"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                "FLOWSVC_LIMITS_INTERNAL_RPM": "0", "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
                **{f"FLOWSVC_PLUGINS_PROJECTS_{key}": value
                   for key, value in project_settings.items()},
                **{f"FLOWSVC_PLUGINS_WEBHOOKS_{key}": value for key, value in webhooks.items()},
                **(extra or {})}
    return settings_env(tmp_path / name / "var", database_url=database_url,
                        redis_url=redis_url, redis_prefix=prefix,
                        plugins=["auth", "chain", "webhooks", "projects"], extra=settings)


def projects_env(var_dir: Path, *, database_url: str, redis_url: str = "",
                 prefix: str | None = None, extra_env: dict[str, str] | None = None,
                 **settings: str) -> dict[str, str]:
    """A test service with the auth, chain (its token registry) and projects plugins;
    ``settings`` are ``[plugins.projects]`` keys (``run_slots="1"``), ``extra_env`` other
    variables. Request limits are lifted: stream tests open hundreds of anonymous
    connections from one IP."""
    extra = {f"FLOWSVC_PLUGINS_PROJECTS_{key.upper()}": value for key, value in settings.items()}
    extra.update(extra_env or {})
    extra.update({"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0", "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0",
                  "FLOWSVC_LIMITS_INTERNAL_RPM": "0"})
    return settings_env(var_dir, database_url=database_url, redis_url=redis_url,
                        redis_prefix=prefix or redis_prefix(),
                        plugins=["auth", "chain", "projects"], extra=extra)


@asynccontextmanager
async def token_owner(running: Running, slug: str) -> AsyncIterator[httpx.AsyncClient]:
    """A signed-in client owning a fresh token named ``slug``."""
    async with client(running) as http:
        wallet, _ = await sign_in(http)
        registered = await add_token(running.base_url, slug, wallet.address.lower())
        assert registered.status_code == 201, registered.text
        yield http


async def new_project(http: httpx.AsyncClient, token_slug: str, **fields: Any) -> dict[str, Any]:
    """Create a project; returns the answer of ``POST /projects``."""
    body = {"tokenSlug": token_slug, "title": "Luigi's Pizza", "brief": BRIEF,
            "agentTemplate": "fullstack-builder", **fields}
    created = await http.post("/projects", json=body)
    assert created.status_code == 201, created.text
    answer: dict[str, Any] = created.json()
    return answer


@asynccontextmanager
async def serve_projects(var_dir: Path, database_url: str, redis_url: str = "",
                         extra_env: dict[str, str] | None = None,
                         **settings: str) -> AsyncIterator[Running]:
    """A running service with the projects plugin; the rest as in ``projects_env``."""
    env = projects_env(var_dir, database_url=database_url, redis_url=redis_url,
                       extra_env=extra_env, **settings)
    async with running_server(make_settings(env), env) as running:
        yield running


class EventRecorder:
    """Records the account events a service emits (register it on ``service.pm``)."""

    def __init__(self) -> None:
        self.events: list[OutboundEvent] = []

    @hookimpl
    def flowsvc_event_emitted(self, service: Service, connection: Connection,
                              event: OutboundEvent) -> None:
        self.events.append(event)


class GrantedFeatures:
    """Feature flags per user id (register it on ``service.pm``): billing's stand-in."""

    def __init__(self, flags: dict[int, dict[str, bool]]) -> None:
        self.flags = flags

    @hookimpl
    def flowsvc_user_features(self, service: Service, user_id: int) -> dict[str, bool]:
        return self.flags.get(user_id, {})


_OPTIONAL = {"tool_result": {"error", "priceFlow"}, "screenshot": {"caption"},
             "done": {"previewUrl"}}
_REQUIRED: dict[str, dict[str, Any]] = {
    "plan": {"steps": list, "revision": int},
    "tool_call": {"tool": str, "args": object, "callId": str},
    "tool_result": {"callId": str, "result": object},
    "message": {"role": str, "text": str},
    "screenshot": {"url": str},
    "commit": {"sha": str, "message": str, "files": list},
    "error": {"message": str, "recoverable": bool},
    "done": {"runId": str, "finalStatus": str},
}


def assert_well_formed(events: list[SseEvent], first_id: int = 1) -> None:
    """Every event has the spec's shape exactly, and ids count up by one from ``first_id``."""
    for offset, event in enumerate(events):
        assert event.id == str(first_id + offset), (event.id, first_id + offset)
        data = event.json()
        required = _REQUIRED[event.event]
        assert set(required) <= set(data) <= set(required) | _OPTIONAL.get(event.event, set()), \
            (event.event, data)
        for name, kind in required.items():
            assert isinstance(data[name], kind), (event.event, name, data[name])
        if event.event == "message":
            assert data["role"] == "assistant"
        if event.event == "commit":
            assert len(data["sha"]) == 40 and all(isinstance(f, str) for f in data["files"])
        if event.event == "tool_result" and "error" in data:
            assert isinstance(data["error"], str)
        if event.event == "tool_result" and "priceFlow" in data:  # a billed call's price
            assert re.fullmatch(r"\d+\.\d{6}", data["priceFlow"]), data
        if event.event == "done":
            assert data["finalStatus"] in ("completed", "failed", "cancelled")


async def eventually(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    """Wait until ``check()`` is true (state another process or task changes).

    :raises trio.TooSlowError: it did not become true within ``timeout`` seconds.
    """
    with trio.fail_after(timeout):
        for _ in itertools.count():
            if await check():
                return
            await trio.sleep(0.02)


def sample(metrics: str, name: str) -> float:
    """The value of ``name`` (labels included) in the Prometheus text ``metrics``; 0 when
    it is not there."""
    found = re.search(rf"^{re.escape(name)} (\S+)$", metrics, re.M)
    return float(found[1]) if found else 0.0


async def _answers(port: int, process: trio.Process) -> bool:
    """Wait (30 s at most) until ``/healthz`` answers; False if it never does or it exits."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=1,
                                 verify=tls_context()) as probe:
        for _ in range(300):
            if process.returncode is not None:
                return False
            try:
                if (await probe.get("/healthz")).status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            await trio.sleep(0.1)
    return False


@asynccontextmanager
async def service_process(env: dict[str, str], port: int, log_path: Path
                          ) -> AsyncIterator[trio.Process]:
    """``flowsvc serve`` in its own process on ``port``, its output in ``log_path`` (a
    file, never a pipe nobody reads: a full pipe would block the server's logging).

    :raises RuntimeError: it exits or does not answer ``/healthz`` within 30 seconds.
    """
    with log_path.open("wb") as log:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-m", "runtime.cli", "--config", os.devnull, "serve",
             "--bind", f"127.0.0.1:{port}"],
            cwd=ROOT, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    try:
        if not await _answers(port, process):
            output = await trio.Path(log_path).read_text()
            raise RuntimeError(f"flowsvc on port {port} did not start:\n{output[-3000:]}")
        yield process
    finally:
        process.terminate()
        with trio.move_on_after(15) as waiting:
            await process.wait()
        if waiting.cancelled_caught:
            process.kill()
            await process.wait()


async def crowd_follows_a_run(running: Running, http: httpx.AsyncClient, slug: str,
                              readers: int) -> list[list[SseEvent]]:
    """``readers`` subscribers of the project's stream, all connected before ``http`` starts
    its run; what each received, up to ``done``."""
    received: list[list[SseEvent]] = []
    connected = trio.Semaphore(0)

    async def reader() -> None:
        async with open_sse(running.base_url, f"/projects/{slug}/stream") as stream:
            assert stream.status == 200
            connected.release()
            received.append(await stream.until("done", timeout=120))

    async with trio.open_nursery() as crowd:
        for _ in range(readers):
            crowd.start_soon(reader)
        for _ in range(readers):
            await connected.acquire()
        assert (await http.post(f"/projects/{slug}/start")).status_code == 201
    return received
