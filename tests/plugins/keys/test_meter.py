"""The per-key meter over real HTTP: rate caps, spend caps, their headers, and durability."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

import httpx
import pytest
import redis
import trio
from sqlalchemy import Connection

from plugins.keys.errors import ApiKeyInvalid, ApiKeyRevoked
from runtime.contracts.meter import METER_ACTOR, Charge, Charged, ChargeRecord
from runtime.errors import Conflict, SpendCapReached
from runtime.server import Running
from tests.support.backends import REDIS_URL
from tests.support.keys import create_key, keys_env
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in


def _time(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_the_61st_request_with_the_default_cap_gets_429(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        raw = (await create_key(http))["raw_key"]
    async with client(server, headers={"x-api-key": raw}) as key:
        for n in range(60):
            response = await key.get("/healthz")
            assert response.status_code == 200, (n, response.text)
            assert response.headers["X-RateLimit-Limit"] == "60"
            assert response.headers["X-RateLimit-Remaining"] == str(59 - n)
        reset = _time(response.headers["X-RateLimit-Reset"])
        now = datetime.now(UTC)
        assert now < reset <= now + timedelta(seconds=60)
        refused = await key.get("/healthz")
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "rate_limited"
        assert 1 <= int(refused.headers["Retry-After"]) <= 60
        assert refused.headers["X-RateLimit-Remaining"] == "0"


async def test_a_cap_of_zero_never_limits(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        raw = (await create_key(http, rate_limit_rpm=0))["raw_key"]
    async with client(server, headers={"x-api-key": raw}) as key:
        for _ in range(120):
            response = await key.get("/healthz")
            assert response.status_code == 200
            assert "X-RateLimit-Limit" not in response.headers
            assert response.headers["X-FLOW-Cost"] == "0.000000"


async def test_concurrent_requests_get_exactly_the_cap(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        raw = (await create_key(http, rate_limit_rpm=50))["raw_key"]
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=200)
    async with client(server, headers={"x-api-key": raw}, limits=limits) as key:
        async def one() -> None:
            statuses.append((await key.get("/healthz")).status_code)

        async with trio.open_nursery() as nursery:
            for _ in range(200):
                nursery.start_soon(one)
    assert statuses.count(200) == 50
    assert statuses.count(429) == 150


async def test_spend_cap_gives_402_and_the_headers_add_up(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="1")
        raw = key["raw_key"]
        async with client(server, headers={"x-api-key": raw}) as caller:
            costs, used = [], []
            for _ in range(3):
                response = await caller.get("/me")
                assert response.status_code == 200
                assert response.headers["X-FLOW-Period-Limit"] == "1.000000"
                costs.append(Decimal(response.headers["X-FLOW-Cost"]))
                used.append(response.headers["X-FLOW-Period-Used"])
            assert costs == [Decimal("0.4")] * 3
            assert used == ["0.400000", "0.800000", "1.200000"]  # the crossing request is served
            reset = _time(response.headers["X-FLOW-Period-Reset"])
            now = datetime.now(UTC)
            assert reset == datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
            for path in ("/me", "/healthz"):
                refused = await caller.get(path)
                assert refused.status_code == 402
                assert refused.json()["error"]["code"] == "spend_cap_reached"
                assert refused.headers["X-FLOW-Cost"] == "0.000000"
                assert refused.headers["X-FLOW-Period-Used"] == "1.200000"
        [listed] = (await http.get("/me/api-keys")).json()["keys"]
        assert listed["spend_period_used"] == "1.200000"


async def test_a_failed_priced_request_is_refunded(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http)
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            missing = await caller.get("/me/api-keys/999999/usage")
            assert missing.status_code == 404
            assert missing.headers["X-FLOW-Cost"] == "0.000000"
            assert missing.headers["X-FLOW-Period-Used"] == "0.000000"
            assert "X-FLOW-Period-Limit" not in missing.headers
            found = await caller.get(f"/me/api-keys/{key['id']}/usage")
            assert found.status_code == 200
            assert found.headers["X-FLOW-Cost"] == "0.250000"
            assert found.headers["X-FLOW-Period-Used"] == "0.250000"


async def test_changing_the_period_resets_the_spend(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="1")
        path = f"/me/api-keys/{key['id']}"
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            for _ in range(2):
                assert (await caller.get("/me")).status_code == 200
            kept = (await http.patch(path, json={"name": "same period",
                                                 "spend_period": "month"})).json()["key"]
            assert kept["spend_period_used"] == "0.800000"
            reset = (await http.patch(path, json={"spend_period": "week"})).json()["key"]
            assert reset["spend_period_used"] == "0.000000"
            assert reset["spend_limit_flow"] == "1.000000"
            response = await caller.get("/me")
            assert response.headers["X-FLOW-Period-Used"] == "0.400000"
            monday = _time(response.headers["X-FLOW-Period-Reset"])
            assert monday.weekday() == 0 and monday.time().isoformat() == "00:00:00"
            assert timedelta(0) < monday - datetime.now(UTC) <= timedelta(days=7)


async def test_charge_message_meters_spend_for_other_plugins(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="1", spend_period="day")
        meter = server.service.registry.lookup(METER_ACTOR)
        key_id = int(key["id"])
        recorded: list[str] = []

        def record(token: str) -> ChargeRecord:
            return lambda connection: recorded.append(token)

        first = await meter.call(Charge(key_id=key_id, micro_flow=600_000, model="gpt-test",
                                        token="t-1", record=record("t-1")))
        assert isinstance(first, Charged)
        assert (first.micro_flow, first.period_used, first.period_limit) == \
            (600_000, 600_000, 1_000_000)
        # A retry with the same token answers the first charge, charges nothing and does
        # not run its record again.
        again = await meter.call(Charge(key_id=key_id, micro_flow=600_000, model="gpt-test",
                                        token="t-1", record=record("t-1")))
        assert (again.micro_flow, again.period_used) == (600_000, 600_000)

        def refuse(connection: Connection) -> None:
            raise Conflict("the caller's ledger refused it")

        with pytest.raises(Conflict, match="refused it"):  # taken back: nothing charged
            await meter.call(Charge(key_id=key_id, micro_flow=300_000, model="gpt-test",
                                    token="t-refused", record=refuse))
        # Retried, the charge taken back is made anew, once.
        for _ in range(2):
            anew = await meter.call(Charge(key_id=key_id, micro_flow=300_000,
                                           model="gpt-test", token="t-refused",
                                           record=record("t-refused")))
            assert (anew.micro_flow, anew.period_used) == (300_000, 900_000)
        second = await meter.call(Charge(key_id=key_id, micro_flow=600_000, model="gpt-test",
                                         token="t-2", record=record("t-2")))
        assert second.period_used == 1_500_000
        assert recorded == ["t-1", "t-refused", "t-2"]
        with pytest.raises(SpendCapReached):
            await meter.call(Charge(key_id=key_id, micro_flow=1, model="gpt-test", token="t-3"))
        refused = await http.get("/healthz", headers={"x-api-key": key["raw_key"]})
        assert refused.status_code == 402
        with pytest.raises(ApiKeyInvalid):
            await meter.call(Charge(key_id=999_999, micro_flow=1, model="gpt-test", token="t-4"))
        other = await create_key(http)
        assert (await http.delete(f"/me/api-keys/{other['id']}")).status_code == 204
        with pytest.raises(ApiKeyRevoked):
            await meter.call(Charge(key_id=int(other["id"]), micro_flow=1, model="gpt-test",
                                    token="t-5"))
        listed = (await http.get("/me/api-keys")).json()["keys"]
        assert [k["spend_period_used"] for k in listed if k["id"] == key["id"]] == ["1.500000"]
        usage = (await http.get(f"/me/api-keys/{key['id']}/usage",
                                params={"since": "all"})).json()["usage"]
        assert (usage["charges"], usage["cost_flow"]) == (3, "1.500000")


async def test_key_requests_share_the_owners_bucket(tmp_path: Path,
                                                    backend: tuple[str, str]) -> None:
    env = keys_env(tmp_path / "var", *backend,
                   extra={"FLOWSVC_LIMITS_AUTHENTICATED_RPM": "5"})
    async with running_server(make_settings(env), env) as server, client(server) as http:
        await sign_in(http)
        raw = (await create_key(http, rate_limit_rpm=0))["raw_key"]  # 1 session request
        assert (await http.get("/me")).status_code == 200  # 2
        async with client(server, headers={"x-api-key": raw}) as caller:
            for _ in range(3):  # 3, 4, 5
                assert (await caller.get("/me")).status_code == 200
            refused = await caller.get("/me")
            assert refused.status_code == 429
            assert "per user" in refused.json()["error"]["message"]
            assert 1 <= int(refused.headers["Retry-After"]) <= 60
        session_refused = await http.get("/me")
        assert session_refused.status_code == 429


def _flush_redis(prefix: str) -> None:
    connection = redis.Redis.from_url(REDIS_URL)
    try:
        names = list(connection.scan_iter(match=f"{prefix}*"))
        if names:
            connection.delete(*names)
    finally:
        connection.close()


async def test_spend_survives_a_restart_of_the_whole_service(tmp_path: Path,
                                                             backend: tuple[str, str]) -> None:
    prefix = f"flowsvc-test:{tmp_path.name}:"
    env = keys_env(tmp_path / "var", *backend, pricing={"GET /me": "0.4"}, prefix=prefix)
    settings = make_settings(env)
    async with running_server(settings, env) as server, client(server) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="10")
        cookie = http.cookies["svc_session"]
        for _ in range(2):
            assert (await http.get("/me", headers={"x-api-key": key["raw_key"]})
                    ).status_code == 200
    if backend[1]:
        _flush_redis(prefix)  # Redis restarted empty too
    async with running_server(settings, env) as server, client(server) as http:
        http.cookies.set("svc_session", cookie)
        [listed] = (await http.get("/me/api-keys")).json()["keys"]
        assert listed["spend_period_used"] == "0.800000"
        again = await http.get("/me", headers={"x-api-key": key["raw_key"]})
        assert again.headers["X-FLOW-Period-Used"] == "1.200000"
