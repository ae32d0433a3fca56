"""``/me/api-keys`` end to end: create, list, patch, revoke, and authenticating with keys."""

from __future__ import annotations

import hashlib
import re

from runtime.server import Running
from tests.support.keys import create_key
from tests.support.server import client, make_settings, running_server
from tests.support.wallet import sign_in

RAW_KEY = re.compile(r"^sk_live_[0-9a-f]{64}$")


async def test_raw_key_is_shown_once_and_works_as_header_and_bearer(server: Running) -> None:
    async with client(server) as http:
        _, user = await sign_in(http)
        created = await create_key(http, name="ci runner")
        raw = created["raw_key"]
        assert RAW_KEY.match(raw)
        assert created["prefix"] == raw[:12]
        assert created["name"] == "ci runner"
        assert created["rate_limit_rpm"] == 60
        assert created["spend_period"] == "month"
        assert created["spend_limit_flow"] is None
        assert created["spend_period_used"] == "0.000000"
        assert created["last_used_at"] is None and created["revoked_at"] is None
        listed = await http.get("/me/api-keys")
        assert listed.status_code == 200
        text = listed.text
        assert raw not in text and raw[12:] not in text
        assert hashlib.sha256(raw.encode()).hexdigest() not in text
        [entry] = listed.json()["keys"]
        assert "raw_key" not in entry and entry["id"] == created["id"]
        assert listed.json()["nextCursor"] is None
    async with client(server) as anonymous:
        for headers in ({"x-api-key": raw}, {"Authorization": f"Bearer {raw}"}):
            me = await anonymous.get("/me", headers=headers)
            assert me.status_code == 200, me.text
            assert me.json()["user"]["id"] == user["id"]
        # A key manages keys like a session does; the listing never shows a raw key again.
        second = await anonymous.post("/me/api-keys", json={"name": "made with a key"},
                                      headers={"x-api-key": raw})
        assert second.status_code == 201, second.text
        listed = await anonymous.get("/me/api-keys", headers={"x-api-key": raw})
        assert [k["name"] for k in listed.json()["keys"]] == ["made with a key", "ci runner"]
        assert raw not in listed.text and second.json()["key"]["raw_key"] not in listed.text


async def test_invalid_values_are_clear_400s(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        bad_bodies = [
            ({}, "name"), ({"name": ""}, "name"), ({"name": "x" * 65}, "name"),
            ({"name": "k", "rate_limit_rpm": -1}, "rate_limit_rpm"),
            ({"name": "k", "rate_limit_rpm": "60"}, "rate_limit_rpm"),
            ({"name": "k", "rate_limit_rpm": 1_000_001}, "rate_limit_rpm"),
            ({"name": "k", "spend_period": "year"}, "spend_period"),
            ({"name": "k", "spend_limit_flow": "1.1234567"}, "spend_limit_flow"),
            ({"name": "k", "spend_limit_flow": "-1"}, "spend_limit_flow"),
            ({"name": "k", "spend_limit_flow": "lots"}, "spend_limit_flow"),
            ({"name": "k", "spend_limit_flow": True}, "spend_limit_flow"),
            ({"name": "k", "secret": "x"}, "secret"),
        ]
        for body, field in bad_bodies:
            response = await http.post("/me/api-keys", json=body)
            assert response.status_code == 400, (body, response.text)
            error = response.json()["error"]
            assert error["code"] == "invalid_request"
            assert any(field in detail["field"] for detail in error["details"]), error
        # A JSON number with 7 decimals is refused, not rounded (it is read as a decimal).
        seven = await http.post("/me/api-keys",
                                content=b'{"name":"k","spend_limit_flow":1.0000001}',
                                headers={"Content-Type": "application/json"})
        assert seven.status_code == 400 and "6 decimals" in seven.json()["error"]["message"]
        exact = await http.post("/me/api-keys", content=b'{"name":"k","spend_limit_flow":2.5}',
                                headers={"Content-Type": "application/json"})
        assert exact.status_code == 201 and exact.json()["key"]["spend_limit_flow"] == "2.500000"
        as_string = await create_key(http, spend_limit_flow="0.000001", spend_period="forever",
                                     rate_limit_rpm=0, name="x" * 64)
        assert as_string["spend_limit_flow"] == "0.000001"
        assert as_string["spend_period_reset"] == "9999-12-31T23:59:59.999Z"


async def test_patch_changes_only_passed_fields(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http, rate_limit_rpm=10, spend_limit_flow="5", spend_period="day")
        path = f"/me/api-keys/{key['id']}"
        renamed = await http.patch(path, json={"name": "renamed"})
        assert renamed.status_code == 200, renamed.text
        body = renamed.json()["key"]
        assert body["name"] == "renamed"
        assert (body["rate_limit_rpm"], body["spend_limit_flow"], body["spend_period"]) == \
            (10, "5.000000", "day")
        uncapped = (await http.patch(path, json={"spend_limit_flow": None,
                                                 "rate_limit_rpm": 0})).json()["key"]
        assert uncapped["spend_limit_flow"] is None and uncapped["rate_limit_rpm"] == 0
        assert uncapped["name"] == "renamed"
        for body in ({"name": None}, {"rate_limit_rpm": -5}, {"spend_period": "hour"},
                     {"prefix": "sk_live_0000"}):
            refused = await http.patch(path, json=body)
            assert refused.status_code == 400, (body, refused.text)
        assert (await http.patch("/me/api-keys/999999", json={"name": "x"})).status_code == 404


async def test_keys_of_others_are_not_found(server: Running) -> None:
    async with client(server) as owner, client(server) as stranger:
        await sign_in(owner)
        await sign_in(stranger)
        key = await create_key(owner)
        path = f"/me/api-keys/{key['id']}"
        for method, suffix in (("PATCH", ""), ("DELETE", ""), ("GET", "/usage"),
                               ("GET", "/recent")):
            response = await stranger.request(method, path + suffix,
                                              json={"name": "x"} if method == "PATCH" else None)
            assert response.status_code == 404, (method, suffix, response.text)
        assert (await stranger.get("/me/api-keys")).json()["keys"] == []
        assert (await owner.get(path + "/usage")).status_code == 200


async def test_revoke_is_a_soft_delete_and_the_key_gets_401(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        key = await create_key(http)
        raw = key["raw_key"]
        assert (await http.get("/me", headers={"x-api-key": raw})).status_code == 200
        deleted = await http.delete(f"/me/api-keys/{key['id']}")
        assert deleted.status_code == 204 and deleted.content == b""
        async with client(server) as caller:
            for headers in ({"x-api-key": raw}, {"Authorization": f"Bearer {raw}"}):
                refused = await caller.get("/me", headers=headers)
                assert refused.status_code == 401
                assert refused.json()["error"]["code"] == "api_key_revoked"
        assert (await http.get("/me/api-keys")).json()["keys"] == []
        assert (await http.delete(f"/me/api-keys/{key['id']}")).status_code == 404
        # The record stays for audit: its usage can still be read by its owner.
        assert (await http.get(f"/me/api-keys/{key['id']}/usage")).status_code == 200


async def test_an_invalid_key_wins_over_a_valid_bearer(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        session = http.cookies["svc_session"]
        good = (await create_key(http))["raw_key"]
    unknown = "sk_live_" + "0" * 64
    async with client(server) as caller:
        cases = [
            ({"x-api-key": unknown, "Authorization": f"Bearer {session}"}, "api_key_invalid"),
            ({"x-api-key": unknown, "Authorization": f"Bearer {good}"}, "api_key_invalid"),
            ({"x-api-key": "not-a-key", "Authorization": f"Bearer {session}"},
             "api_key_invalid"),
            ({"x-api-key": unknown}, "api_key_invalid"),
            ({"Authorization": f"Bearer {unknown}"}, "api_key_invalid"),
            ({"Authorization": "Bearer sk_live_short"}, "api_key_invalid"),
        ]
        for headers, code in cases:
            response = await caller.get("/me", headers=headers)
            assert response.status_code == 401, (headers, response.text)
            assert response.json()["error"]["code"] == code
        # The same bearer alone is fine, and a valid key wins over the session.
        assert (await caller.get("/me", headers={"Authorization": f"Bearer {session}"})
                ).status_code == 200
        both = await caller.get("/me", headers={"x-api-key": good,
                                                "Authorization": f"Bearer {session}"})
        assert both.status_code == 200 and "X-FLOW-Cost" in both.headers


async def test_list_pages_with_a_cursor(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        names = [f"key {n}" for n in range(3)]
        for name in names:
            await create_key(http, name=name)
        first = (await http.get("/me/api-keys", params={"limit": 2})).json()
        assert [k["name"] for k in first["keys"]] == ["key 2", "key 1"]
        assert first["nextCursor"]
        second = (await http.get("/me/api-keys", params={"limit": 2,
                                                         "cursor": first["nextCursor"]})).json()
        assert [k["name"] for k in second["keys"]] == ["key 0"]
        assert second["nextCursor"] is None
        bad = await http.get("/me/api-keys", params={"cursor": "garbage!"})
        assert bad.status_code == 400


async def test_a_repeated_creation_replays_without_the_raw_key(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        headers = {"Idempotency-Key": "create-once"}
        first = await http.post("/me/api-keys", json={"name": "once"}, headers=headers)
        assert first.status_code == 201
        raw = first.json()["key"]["raw_key"]
        assert RAW_KEY.match(raw)
        again = await http.post("/me/api-keys", json={"name": "once"}, headers=headers)
        assert again.status_code == 201
        assert again.headers["Idempotent-Replayed"] == "true"
        assert again.json()["key"]["id"] == first.json()["key"]["id"]
        assert again.json()["key"]["raw_key"] is None and raw not in again.text
        assert len((await http.get("/me/api-keys")).json()["keys"]) == 1
        stored = await server.service.db.read(
            lambda connection: connection.exec_driver_sql(
                "SELECT body FROM idempotency_keys").fetchall())
        assert stored and all(raw.encode() not in bytes(row[0]) for row in stored)


async def test_a_refused_creation_replays_its_refusal(env: dict[str, str]) -> None:
    env = {**env, "FLOWSVC_PLUGINS_KEYS_MAX_KEYS_PER_USER": "1"}
    async with running_server(make_settings(env), env) as running, client(running) as http:
        await sign_in(http)
        await create_key(http, name="the only one")
        headers = {"Idempotency-Key": "one-too-many"}
        refused = await http.post("/me/api-keys", json={"name": "second"}, headers=headers)
        assert refused.status_code == 409
        assert refused.json()["error"]["code"] == "key_limit_reached"
        again = await http.post("/me/api-keys", json={"name": "second"}, headers=headers)
        assert again.status_code == 409  # the stored refusal, not idempotency_in_progress
        assert again.json()["error"]["code"] == "key_limit_reached"
        assert again.headers["Idempotent-Replayed"] == "true"
