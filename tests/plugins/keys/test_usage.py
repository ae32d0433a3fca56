"""The usage log over real HTTP: aggregates and recent calls match what was sent, and a
stalled database neither slows key requests nor goes unnoticed."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from decimal import Decimal
from pathlib import Path

import psycopg
import trio

from runtime.contracts.meter import METER_ACTOR, Charge
from runtime.server import Running
from tests.support.keys import create_key, keys_env, wait_for_calls
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in


async def test_usage_and_recent_match_what_was_sent(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=0)
        key_id = key["id"]
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            for _ in range(3):
                assert (await caller.get("/me")).status_code == 200
            for _ in range(2):
                assert (await caller.get("/me/api-keys/999999/recent")).status_code == 404
            assert (await caller.get("/no/such/route")).status_code == 404
        await server.service.registry.lookup(METER_ACTOR).call(
            Charge(key_id=int(key_id), micro_flow=500_000, model="gpt-test", token="usage-1"))
        calls = await wait_for_calls(http, key_id, 7)
        assert len(calls) == 7
        assert calls[0]["kind"] == "charge" and calls[0]["model"] == "gpt-test"
        assert calls[0]["cost_flow"] == "0.500000" and calls[0]["status"] is None
        assert [call["at"] for call in calls] == sorted((call["at"] for call in calls),
                                                        reverse=True)
        requests = [call for call in calls if call["kind"] == "request"]
        assert sorted((c["method"], c["route"] or "", c["status"], c["cost_flow"])
                      for c in requests) == sorted(
            [("GET", "/me", 200, "0.400000")] * 3
            + [("GET", "/me/api-keys/<int:key_id>/recent", 404, "0.000000")] * 2
            + [("GET", "", 404, "0.000000")])
        assert all(call["latency_ms"] >= 0 for call in requests)
        for since in ("day", "week", "month", "all"):
            response = await http.get(f"/me/api-keys/{key_id}/usage", params={"since": since})
            assert response.status_code == 200
            usage = response.json()["usage"]
            assert (usage["since"], usage["requests"], usage["charges"], usage["errors"]) == \
                (since, 6, 1, 3)
            assert Decimal(usage["cost_flow"]) == Decimal("1.7")
            by_model = {entry["model"]: entry for entry in usage["by_model"]}
            assert set(by_model) == {"gpt-test", "route:auth", "route:keys", "route:unmatched"}
            assert (by_model["route:auth"]["requests"], by_model["route:auth"]["cost_flow"]) == \
                (3, "1.200000")
            assert (by_model["gpt-test"]["charges"], by_model["gpt-test"]["cost_flow"]) == \
                (1, "0.500000")
            assert by_model["route:keys"]["requests"] == 2
        assert (await http.get(f"/me/api-keys/{key_id}/usage",
                               params={"since": "year"})).status_code == 400
        [listed] = (await http.get("/me/api-keys")).json()["keys"]
        assert listed["last_used_at"] is not None


async def test_recent_clamps_limit_to_200(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=0)
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            for _ in range(205):
                assert (await caller.get("/healthz")).status_code == 200
        await wait_for_calls(http, key["id"], 200)
        path = f"/me/api-keys/{key['id']}/recent"
        with trio.fail_after(10):
            # The log is written in batches, with nothing to await: poll as a client would.
            while (await http.get(f"/me/api-keys/{key['id']}/usage")).json()[  # noqa: ASYNC110
                    "usage"]["requests"] < 205:
                await trio.sleep(0.1)
        assert len((await http.get(path, params={"limit": 1000})).json()["calls"]) == 200
        assert len((await http.get(path, params={"limit": 3})).json()["calls"]) == 3
        assert len((await http.get(path)).json()["calls"]) == 50
        assert (await http.get(path, params={"limit": 0})).status_code == 400


@contextmanager
def _database_locked(database_url: str) -> Iterator[None]:
    """Hold the usage table's write lock from outside the service, like a stuck writer."""
    if database_url.startswith("sqlite"):
        lite = sqlite3.connect(database_url.split("///", 1)[1], isolation_level=None)
        lite.execute("BEGIN EXCLUSIVE")
        try:
            yield
        finally:
            lite.execute("ROLLBACK")
            lite.close()
        return
    with psycopg.connect(database_url) as postgres:
        postgres.execute("LOCK TABLE api_key_usage IN ACCESS EXCLUSIVE MODE")
        try:
            yield
        finally:
            postgres.rollback()


async def test_a_stalled_database_slows_no_request_and_overflow_is_counted(
        tmp_path: Path, backend: tuple[str, str]) -> None:
    env = keys_env(tmp_path / "var", *backend,
                   extra={"FLOWSVC_PLUGINS_KEYS_USAGE_BUFFER": "3",
                          "FLOWSVC_PLUGINS_KEYS_USAGE_FLUSH_SECONDS": "0.05"})
    async with running_server(make_settings(env), env) as server, client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=0)
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            assert (await caller.get("/healthz")).status_code == 200  # the key is cached now
            await wait_for_calls(http, key["id"], 1)
            with _database_locked(backend[0]):
                slowest = 0.0
                for _ in range(40):
                    started = time.perf_counter()
                    assert (await caller.get("/healthz")).status_code == 200
                    slowest = max(slowest, time.perf_counter() - started)
                ready = (await http.get("/readyz")).json()
                assert ready["checks"]["keys.usage"]["dropped_overflow"] > 0
                assert slowest < 0.5
            metrics = (await http.get("/metrics")).text
            assert 'flowsvc_keys_usage_dropped_total{reason="overflow"}' in metrics
