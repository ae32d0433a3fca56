"""A frozen PostgreSQL and a frozen Redis (SIGSTOP: connections stay open, nothing answers).

The service runs on a private server (``tests.support.private_servers``) that is frozen while
requests flow. Every request that needs it answers 503 ``unavailable`` with ``Retry-After``
within the documented bound (its deadline plus a wide margin for a loaded machine), nothing
hangs past it, ``/readyz`` answers 503 naming it, and after SIGCONT everything works again.
A key created during the freeze exists only if its creation was answered 201: a write
abandoned at the deadline rolls back. The time to each 503 is printed (``-s``) and written
down in ``docs/failure-behaviour.md``.
"""

from __future__ import annotations

import statistics
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
import trio

from runtime.config import DatabaseSettings, RedisSettings, ServiceSettings
from tests.support.backends import redis_prefix
from tests.support.private_servers import frozen, private_postgres, private_redis
from tests.support.server import make_settings, running_server, settings_env
from tests.support.wallet import sign_in

FREEZE_SECONDS = 12.0  # two database deadlines and more: each client is caught more than once
MARGIN_SECONDS = 5.0  # on top of a deadline, for a loaded two-core machine
RECOVERY_SECONDS = 30.0
DATABASE_BOUND = DatabaseSettings().timeout_seconds + MARGIN_SECONDS
REDIS_BOUND = RedisSettings().timeout_seconds + MARGIN_SECONDS
READYZ_BOUND = ServiceSettings().readiness_timeout_seconds + MARGIN_SECONDS
PLUGINS = ["auth", "keys", "chain", "projects", "marketplace"]
OPEN_LIMITS = {"FLOWSVC_LIMITS_ANONYMOUS_RPM": "100000",
               "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "100000"}


@dataclass
class Seen:
    """What one route answered during the freeze: statuses, the slowest answer, the slowest
    503, and whether every 503 was ``unavailable`` with ``Retry-After``."""

    statuses: Counter[int] = field(default_factory=Counter)
    slowest: float = 0.0
    slowest_503: float = 0.0
    times_503: list[float] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    down: set[str] = field(default_factory=set)

    def note(self, response: httpx.Response, took: float) -> None:
        self.statuses[response.status_code] += 1
        self.slowest = max(self.slowest, took)
        if response.status_code == 503:
            self.slowest_503 = max(self.slowest_503, took)
            self.times_503.append(took)
            if response.json()["error"]["code"] != "unavailable" \
                    or not response.headers.get("retry-after", "").isdigit():
                self.bad.append(response.text[:200])
            checks = response.json().get("checks", {})
            self.down |= {name for name, check in checks.items() if not check["ok"]}
        elif response.status_code >= 500:
            self.bad.append(f"{response.status_code} {response.text[:200]}")


async def hammer(http: httpx.AsyncClient, method: str, path: str, seen: Seen,
                 until: trio.Event) -> None:
    """Send ``method path`` again and again (each waiting for its answer) until ``until``."""
    while not until.is_set():
        began = time.monotonic()
        response = await http.request(method, path, json={"name": "k"} if method == "POST"
                                      else None)
        seen.note(response, time.monotonic() - began)
        await trio.sleep(0.2)


async def flow_while_frozen(http: httpx.AsyncClient, routes: list[tuple[str, str]],
                            server: object) -> dict[str, Seen]:
    """Requests to ``routes`` (three clients each) for ``FREEZE_SECONDS`` of ``server``
    frozen; what each route answered."""
    seen = {f"{method} {path}": Seen() for method, path in routes}
    with frozen(server):  # type: ignore[arg-type]
        done = trio.Event()
        async with trio.open_nursery() as nursery:
            for method, path in routes:
                for _ in range(3):
                    nursery.start_soon(hammer, http, method, path, seen[f"{method} {path}"],
                                       done)
            await trio.sleep(FREEZE_SECONDS)
            done.set()
    for name, route in seen.items():
        median = statistics.median(route.times_503) if route.times_503 else 0.0
        print(f"{name}: {dict(route.statuses)}, 503 in {median:.2f} s (median), at most "
              f"{route.slowest_503:.2f} s; slowest answer {route.slowest:.2f} s")
    return seen


async def ready_again(http: httpx.AsyncClient) -> float:
    began = time.monotonic()
    with trio.fail_after(RECOVERY_SECONDS):
        while (await http.get("/readyz")).status_code != 200:  # noqa: ASYNC110 - polling HTTP
            await trio.sleep(0.1)
    return time.monotonic() - began


@pytest.mark.timeout(180)
async def test_a_frozen_postgresql_answers_503_within_the_deadline_and_recovers(
        tmp_path: Path) -> None:
    with private_postgres() as postgres:
        env = settings_env(tmp_path / "var", database_url=postgres.url,
                           plugins=PLUGINS, extra=OPEN_LIMITS)
        async with running_server(make_settings(env), env) as running, \
                httpx.AsyncClient(base_url=running.base_url, timeout=60) as http:
            await sign_in(http)
            assert (await http.post("/me/api-keys", json={"name": "before"})).status_code == 201
            seen = await flow_while_frozen(http, [
                ("GET", "/readyz"), ("GET", "/marketplace/agents"), ("GET", "/me/api-keys"),
                ("POST", "/me/api-keys"), ("GET", "/me")], postgres)
            recovered = await ready_again(http)
            print(f"ready {recovered:.2f} s after SIGCONT")
            keys = await http.get("/me/api-keys")
            assert keys.status_code == 200, keys.text
            created = (await http.post("/me/api-keys", json={"name": "after"})).status_code
            assert created == 201
            me = await http.get("/me")
            assert me.status_code == 200
    for name, route in seen.items():
        assert route.bad == [], (name, route.bad)
        assert route.slowest < (READYZ_BOUND if "readyz" in name else DATABASE_BOUND), name
        assert set(route.statuses) <= {200, 201, 503}, (name, route.statuses)
    for name in ("GET /readyz", "GET /marketplace/agents", "GET /me/api-keys",
                 "POST /me/api-keys"):
        assert seen[name].statuses[503] > 0, (name, seen[name].statuses)
    assert seen["GET /readyz"].down == {"database"}
    # Only the creations answered 201 exist: each one abandoned at the deadline rolled back.
    names = [key["name"] for key in keys.json()["keys"]]
    assert names.count("k") == seen["POST /me/api-keys"].statuses[201]
    assert names.count("before") == 1


@pytest.mark.timeout(180)
async def test_a_frozen_redis_answers_503_within_the_deadline_and_recovers(
        tmp_path: Path) -> None:
    with private_redis() as redis:
        env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path}/flowsvc.db",
                           redis_url=redis.url, redis_prefix=redis_prefix(),
                           plugins=PLUGINS, extra=OPEN_LIMITS)
        async with running_server(make_settings(env), env) as running, \
                httpx.AsyncClient(base_url=running.base_url, timeout=60) as http:
            await sign_in(http)
            seen = await flow_while_frozen(http, [
                ("GET", "/readyz"), ("GET", "/marketplace/agents"), ("GET", "/me/api-keys"),
                ("POST", "/me/api-keys"), ("GET", "/me"), ("GET", "/healthz")], redis)
            recovered = await ready_again(http)
            print(f"ready {recovered:.2f} s after SIGCONT")
            for path in ("/me", "/me/api-keys", "/marketplace/agents"):
                assert (await http.get(path)).status_code == 200, path
            assert (await http.post("/me/api-keys", json={"name": "after"})).status_code == 201
    for name, route in seen.items():
        assert route.bad == [], (name, route.bad)
        assert route.slowest < (READYZ_BOUND if "readyz" in name else REDIS_BOUND), name
    for name in ("GET /readyz", "GET /marketplace/agents", "GET /me/api-keys",
                 "POST /me/api-keys", "GET /me"):
        assert seen[name].statuses[503] > 0, (name, seen[name].statuses)
    assert seen["GET /readyz"].down == {"redis"}
    assert set(seen["GET /healthz"].statuses) == {200}
