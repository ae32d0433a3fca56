"""The service-wide request buckets (runtime.limits) over real HTTP, in memory and in Redis."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from tests.support.backends import redis_prefix
from tests.support.server import INTERNAL, client, make_settings, running_server, settings_env
from tests.support.wallet import sign_in


@asynccontextmanager
async def _service(tmp_path: Path, redis_url: str, **limits: object
                   ) -> AsyncIterator[httpx.AsyncClient]:
    extra = {f"FLOWSVC_{name.upper()}": value if isinstance(value, str) else json.dumps(value)
             for name, value in limits.items()}
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       redis_url=redis_url, redis_prefix=redis_prefix(), extra=extra)
    async with running_server(make_settings(env), env) as running, client(running) as http:
        yield http


async def test_anonymous_requests_get_30_per_minute_per_ip(tmp_path: Path, redis_url: str) -> None:
    async with _service(tmp_path, redis_url) as http:
        for _ in range(40):
            assert (await http.get("/healthz")).status_code == 200  # probes are not counted
        for _ in range(30):
            assert (await http.get("/no/such/page")).status_code == 404
        refused = await http.get("/no/such/page")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60


async def test_forwarded_for_counts_only_behind_a_trusted_proxy(tmp_path: Path,
                                                                redis_url: str) -> None:
    async with _service(tmp_path, redis_url, limits_anonymous_rpm="2",
                        service_trusted_proxies=["127.0.0.1/32"]) as http:
        first = {"X-Forwarded-For": "203.0.113.7"}
        assert [(await http.get("/x", headers=first)).status_code for _ in range(3)] == \
            [404, 404, 429]
        assert (await http.get("/x", headers={"X-Forwarded-For": "203.0.113.8"})
                ).status_code == 404
    async with _service(tmp_path / "untrusted", redis_url, limits_anonymous_rpm="2") as http:
        statuses = [(await http.get("/x", headers={"X-Forwarded-For": f"203.0.113.{n}"})
                     ).status_code for n in range(3)]
        assert statuses == [404, 404, 429]  # the header is ignored: one socket, one bucket


async def test_each_user_has_a_bucket(tmp_path: Path, redis_url: str) -> None:
    async with _service(tmp_path, redis_url, limits_authenticated_rpm="3") as http:
        await sign_in(http)
        assert [(await http.get("/me")).status_code for _ in range(4)] == [200, 200, 200, 429]
        http.cookies.clear()
        await sign_in(http)
        assert (await http.get("/me")).status_code == 200


async def test_the_internal_token_has_its_bucket_and_zero_disables(tmp_path: Path,
                                                                   redis_url: str) -> None:
    async with _service(tmp_path, redis_url, limits_internal_rpm="2",
                        limits_anonymous_rpm="0") as http:
        internal = INTERNAL
        assert [(await http.get("/x", headers=internal)).status_code for _ in range(3)] == \
            [404, 404, 429]
        for _ in range(40):
            assert (await http.get("/x")).status_code == 404


