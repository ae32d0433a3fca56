"""Two real service processes sharing one database (and Redis, when configured).

With Redis, a logout or a user change in one process reaches the other through the
fan-out channel (the database poll is set to a minute, so only the fan-out can pass);
with in-process state, each process has its own, and the database poll (set to 0.2 s)
and the user-cache lifetime (0.5 s) are what must carry it. Both paths run: SQLite with
in-process state, and PostgreSQL with Redis when those are configured.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import httpx
import pytest
import trio

from runtime.bootstrap import open_service
from tests.support.auth import BOT_TOKEN, init_data
from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema, redis_prefix
from tests.support.processes import server_process
from tests.support.server import free_port, make_settings, settings_env
from tests.support.wallet import sign_in

WITHIN_SECONDS = 1.0
SHARED = "postgres+redis" if POSTGRES_URL and REDIS_URL else \
    "postgres" if POSTGRES_URL else "sqlite+redis" if REDIS_URL else None


@pytest.fixture(params=["sqlite"] + ([SHARED] if SHARED else []))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(database URL, Redis URL): SQLite alone, and the configured servers together."""
    redis_url = REDIS_URL if "redis" in request.param else ""
    if request.param.startswith("postgres"):
        with postgres_schema() as url:
            yield url, redis_url
    else:
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}", redis_url


async def _two_servers(stack: ExitStack, env: dict[str, str], ports: list[int]) -> None:
    """Start two ``flowsvc serve`` processes at once (the schema migrated first); ``stack``
    stops them."""
    async with open_service(make_settings(env), migrate=True, environ=env):
        pass
    env = {**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}

    async def start(port: int) -> None:
        own = ExitStack()
        await trio.to_thread.run_sync(own.enter_context, server_process(env, port))
        stack.callback(own.close)

    async with trio.open_nursery() as nursery:
        for port in ports:
            nursery.start_soon(start, port)


async def _within_a_second(http: httpx.AsyncClient, token: str, expect: int,
                           messenger: bool | None = None) -> None:
    """Poll ``GET /me`` with ``token`` until it answers ``expect`` (and shows the messenger)."""
    with trio.fail_after(WITHIN_SECONDS):
        while True:
            answer = await http.get("/me", headers={"Authorization": f"Bearer {token}"})
            shown = answer.status_code == 200 and "messenger" in answer.json()["user"]
            if answer.status_code == expect and messenger in (None, shown):
                return
            # Another process has no event to await: poll it the way a client would.
            await trio.sleep(0.02)


async def test_logout_and_user_changes_reach_the_other_process(
        tmp_path: Path, backend: tuple[str, str]) -> None:
    database_url, redis_url = backend
    fan_out = bool(redis_url)
    env = settings_env(tmp_path / "var", database_url=database_url, redis_url=redis_url,
                       redis_prefix=redis_prefix(), extra={
                           "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
                           "FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": BOT_TOKEN,
                           "FLOWSVC_PLUGINS_AUTH_REVOCATION_POLL_SECONDS":
                               "60" if fan_out else "0.2",
                           "FLOWSVC_PLUGINS_AUTH_USER_CACHE_SECONDS": "60" if fan_out else "0.5",
                       })
    port_a, port_b = free_port(), free_port()
    with ExitStack() as stack:
        await _two_servers(stack, env, [port_a, port_b])
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_a}", timeout=30) as a, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port_b}", timeout=30) as b:
            await sign_in(a)
            token = a.cookies["svc_session"]
            bearer = {"Authorization": f"Bearer {token}"}
            seen_by_b = await b.get("/me", headers=bearer)  # B now caches this user
            assert seen_by_b.status_code == 200 and "messenger" not in seen_by_b.json()["user"]

            linked = await a.post("/auth/messenger", json={"initData": init_data(
                {"id": 4242, "first_name": "Bob"})})
            assert linked.status_code == 200, linked.text
            await _within_a_second(b, token, 200, messenger=True)

            assert (await a.post("/auth/logout", headers=bearer)).status_code == 204
            await _within_a_second(b, token, 401)
