"""Rotation, per-key counts in one call, the request log and its live tail, over real HTTP
(``plugins.keys.rotation`` and ``plugins.keys.activity``)."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import httpx

from runtime.contracts.meter import METER_ACTOR, Charge
from runtime.server import Running
from tests.support.keys import create_key, wait_for_calls
from tests.support.server import client
from tests.support.sse import open_sse
from tests.support.wallet import sign_in


async def _me(server: Running, raw_key: str) -> int:
    async with client(server) as http:
        return (await http.get("/me", headers={"x-api-key": raw_key})).status_code


async def test_rotation_keeps_settings_and_the_old_key_for_its_overlap(server: Running
                                                                       ) -> None:
    async with client(server) as http:
        await sign_in(http)
        old = await create_key(http, name="deploys", rate_limit_rpm=7,
                               spend_limit_flow="2.5", spend_period="week")
        rotated = await http.post(f"/me/api-keys/{old['id']}/rotate",
                                  json={"overlap_seconds": 3600})
        assert rotated.status_code == 201, rotated.text
        new, previous = rotated.json()["key"], rotated.json()["previous"]
        assert new["raw_key"].startswith("sk_live_") and new["id"] != old["id"]
        assert {name: new[name] for name in ("name", "rate_limit_rpm", "spend_limit_flow",
                                             "spend_period")} == {
            "name": "deploys", "rate_limit_rpm": 7, "spend_limit_flow": "2.500000",
            "spend_period": "week"}
        assert previous["id"] == old["id"] and previous["revoked_at"] is not None
        assert await _me(server, new["raw_key"]) == 200
        assert await _me(server, old["raw_key"]) == 200  # within its overlap
        listed = [key["id"] for key in (await http.get("/me/api-keys")).json()["keys"]]
        assert listed == [new["id"]]
        again = await http.post(f"/me/api-keys/{old['id']}/rotate", json={})
        assert again.status_code == 404  # a rotating key is no longer the active one
        # Cutting the overlap short: the old key is revoked at once.
        assert (await http.delete(f"/me/api-keys/{old['id']}")).status_code == 204
        assert await _me(server, old["raw_key"]) == 401
        instant = await http.post(f"/me/api-keys/{new['id']}/rotate", json={})
        assert instant.status_code == 201
        assert await _me(server, new["raw_key"]) == 401
        assert await _me(server, instant.json()["key"]["raw_key"]) == 200
        for bad in ({"overlap_seconds": -1}, {"overlap_seconds": 8 * 86400},
                    {"overlap_seconds": "60"}, {"other": 1}):
            refused = await http.post(f"/me/api-keys/{instant.json()['key']['id']}/rotate",
                                      json=bad)
            assert refused.status_code == 400, bad


async def test_another_user_cannot_rotate_a_key(server: Running) -> None:
    async with client(server) as owner, client(server) as other:
        await sign_in(owner)
        await sign_in(other)
        key = await create_key(owner)
        refused = await other.post(f"/me/api-keys/{key['id']}/rotate", json={})
        assert refused.status_code == 404
        assert await _me(server, key["raw_key"]) == 200


async def _calls(server: Running, raw_key: str, paths: list[str]) -> None:
    async with client(server, headers={"x-api-key": raw_key}) as caller:
        for path in paths:
            await caller.get(path)


async def test_stats_count_outcomes_of_every_key_in_one_call(server: Running) -> None:
    async with client(server) as http, client(server) as other:
        await sign_in(http)
        await sign_in(other)
        first = await create_key(http, name="first", rate_limit_rpm=0)
        second = await create_key(http, name="second", rate_limit_rpm=0)
        foreign = await create_key(other, name="foreign", rate_limit_rpm=0)
        await _calls(server, first["raw_key"], ["/me", "/me", "/no-such-route"])
        await _calls(server, second["raw_key"], ["/me"])
        await _calls(server, foreign["raw_key"], ["/me"])
        await wait_for_calls(http, first["id"], 3)
        await wait_for_calls(http, second["id"], 1)
        answer = await http.get("/me/api-keys/stats", params={"window": "hour"})
        assert answer.status_code == 200
        by_id = {key["key_id"]: key for key in answer.json()["keys"]}
        assert set(by_id) == {first["id"], second["id"]}
        assert by_id[first["id"]]["requests"] == 3
        assert by_id[first["id"]]["outcomes"] == {"ok": 2, "402": 0, "429": 0, "4xx": 1,
                                                  "5xx": 0}
        assert by_id[second["id"]]["outcomes"]["ok"] == 1
        assert by_id[first["id"]]["last_used_at"] is not None
        bad = await http.get("/me/api-keys/stats", params={"window": "year"})
        assert bad.status_code == 400


async def test_the_request_log_filters_and_never_shows_another_users_calls(server: Running
                                                                           ) -> None:
    async with client(server) as http, client(server) as other:
        await sign_in(http)
        await sign_in(other)
        first = await create_key(http, rate_limit_rpm=0)
        second = await create_key(http, rate_limit_rpm=0)
        foreign = await create_key(other, rate_limit_rpm=0)
        await _calls(server, first["raw_key"], ["/me", "/no-such-route"])
        await _calls(server, second["raw_key"], ["/me/api-keys"])
        await _calls(server, foreign["raw_key"], ["/me"])
        await wait_for_calls(http, first["id"], 2)
        await wait_for_calls(http, second["id"], 1)
        await wait_for_calls(other, foreign["id"], 1)

        async def log(**params: Any) -> list[dict[str, Any]]:
            answer = await http.get("/me/api-keys/calls", params=params)
            assert answer.status_code == 200, answer.text
            calls: list[dict[str, Any]] = answer.json()["calls"]
            return calls

        everything = await log()
        assert len(everything) == 3
        assert {call["key_id"] for call in everything} == {first["id"], second["id"]}
        assert [call["route"] for call in await log(key_id=second["id"])] == ["/me/api-keys"]
        assert [call["status"] for call in await log(status=404)] == [404]
        assert len(await log(route="/me")) == 1
        assert await log(key_id=foreign["id"]) == []


async def test_the_request_log_finds_a_call_by_its_request_id(server: Running) -> None:
    async with client(server) as http, client(server) as other:
        await sign_in(http)
        await sign_in(other)
        key = await create_key(http, rate_limit_rpm=0)
        async with client(server, headers={"x-api-key": key["raw_key"]}) as caller:
            assigned = (await caller.get("/me")).headers["x-request-id"]
            chosen = await caller.get("/no-such-route", headers={"X-Request-Id": "trace-42.a"})
            assert chosen.headers["x-request-id"] == "trace-42.a"
            await caller.get("/me")
        await wait_for_calls(http, key["id"], 3)

        async def log(caller: httpx.AsyncClient, request_id: str) -> list[dict[str, Any]]:
            answer = await caller.get("/me/api-keys/calls", params={"request_id": request_id})
            assert answer.status_code == 200, answer.text
            calls: list[dict[str, Any]] = answer.json()["calls"]
            return calls

        found = await log(http, assigned)
        assert [(call["route"], call["request_id"]) for call in found] == [("/me", assigned)]
        assert [call["status"] for call in await log(http, "trace-42.a")] == [404]
        assert await log(http, "no-such-id") == []
        assert await log(other, "trace-42.a") == []  # another user's call stays out of reach
        recent = (await http.get(f"/me/api-keys/{key['id']}/recent")).json()["calls"]
        assert {call["request_id"] for call in recent} >= {assigned, "trace-42.a"}
        too_long = await http.get("/me/api-keys/calls", params={"request_id": "x" * 129})
        assert too_long.status_code == 400
        assert too_long.json()["error"]["code"] == "invalid_request"


async def test_the_tail_streams_new_calls_and_resumes_after_last_event_id(server: Running
                                                                          ) -> None:
    async with client(server) as http, client(server) as other:
        _, _ = await sign_in(http)
        await sign_in(other)
        key = await create_key(http, rate_limit_rpm=0)
        foreign = await create_key(other, rate_limit_rpm=0)
        await _calls(server, key["raw_key"], ["/me"])  # before the tail: not streamed
        await wait_for_calls(http, key["id"], 1)
        cookie = {"Cookie": f"svc_session={http.cookies['svc_session']}"}
        async with open_sse(server.base_url, "/me/api-keys/tail", cookie) as stream:
            assert stream.status == 200
            assert stream.headers["content-type"].startswith("text/event-stream")
            await _calls(server, foreign["raw_key"], ["/me"])
            await _calls(server, key["raw_key"], ["/me/api-keys", "/me"])
            first = await stream.next_event()
            second = await stream.next_event()
        assert (first.event, first.json()["route"]) == ("call", "/me/api-keys")
        assert second.json()["route"] == "/me" and second.json()["key_id"] == key["id"]
        assert first.id is not None and int(second.id or 0) > int(first.id)
        await _calls(server, key["raw_key"], ["/no-such-route"])
        async with open_sse(server.base_url, "/me/api-keys/tail",
                            {**cookie, "Last-Event-ID": first.id}) as resumed:
            again = await resumed.next_event()
            third = await resumed.next_event()
        assert again.id == second.id and third.json()["status"] == 404
        async with httpx.AsyncClient(base_url=server.base_url) as anonymous:
            assert (await anonymous.get("/me/api-keys/tail")).status_code == 401
        bad = await http.get("/me/api-keys/tail", headers={"Last-Event-ID": "x1"})
        assert bad.status_code == 400


async def test_the_series_counts_outcomes_per_bucket(server: Running) -> None:
    async with client(server) as http, client(server) as other:
        await sign_in(http)
        await sign_in(other)
        key = await create_key(http, rate_limit_rpm=0)
        await _calls(server, key["raw_key"], ["/me", "/me", "/no-such-route"])
        await wait_for_calls(http, key["id"], 3)
        answer = await http.get(f"/me/api-keys/{key['id']}/series", params={"window": "hour"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["bucket_seconds"] == 300 and len(body["buckets"]) == 12
        totals = {name: sum(bucket["outcomes"][name] for bucket in body["buckets"])
                  for name in ("ok", "402", "429", "4xx", "5xx")}
        assert totals == {"ok": 2, "402": 0, "429": 0, "4xx": 1, "5xx": 0}
        assert body["buckets"][-1]["outcomes"]["ok"] + body["buckets"][-2]["outcomes"]["ok"] \
            == 2  # now is in the last bucket (or just crossed into it)
        day = (await http.get(f"/me/api-keys/{key['id']}/series")).json()
        assert len(day["buckets"]) == 24 and day["bucket_seconds"] == 3600
        assert (await other.get(f"/me/api-keys/{key['id']}/series")).status_code == 404


async def test_the_series_by_model_counts_calls_and_cost_per_model(server: Running) -> None:
    async with client(server) as http, client(server) as other:
        await sign_in(http)
        await sign_in(other)
        key = await create_key(http, rate_limit_rpm=0)
        await _calls(server, key["raw_key"], ["/me", "/me", "/no-such-route"])
        await server.service.registry.lookup(METER_ACTOR).call(
            Charge(key_id=int(key["id"]), micro_flow=500_000, model="gpt-test",
                   token="series-1"))
        await wait_for_calls(http, key["id"], 4)
        answer = await http.get(f"/me/api-keys/{key['id']}/series",
                                params={"window": "hour", "by": "model"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["by"] == "model" and len(body["buckets"]) == 12
        assert body["models"] == ["route:auth", "gpt-test", "route:unmatched"]
        totals: dict[str, int] = {}
        costs: dict[str, Decimal] = {}
        for bucket in body["buckets"]:
            for model, figures in bucket["models"].items():
                totals[model] = totals.get(model, 0) + figures["calls"]
                costs[model] = costs.get(model, Decimal(0)) + Decimal(figures["cost_flow"])
        assert totals == {"route:auth": 2, "gpt-test": 1, "route:unmatched": 1}
        assert costs == {"route:auth": Decimal("0.8"), "gpt-test": Decimal("0.5"),
                         "route:unmatched": Decimal(0)}
        by_outcome = (await http.get(f"/me/api-keys/{key['id']}/series")).json()
        assert by_outcome["by"] == "outcome" and "models" not in by_outcome
        assert (await http.get(f"/me/api-keys/{key['id']}/series",
                               params={"by": "route"})).status_code == 400
        assert (await other.get(f"/me/api-keys/{key['id']}/series",
                                params={"by": "model"})).status_code == 404
