"""Messaging-platform login over real HTTP: initData validation, linking, telegram_invalid."""

from __future__ import annotations

import time
from pathlib import Path
from urllib.parse import quote

import httpx

from tests.support.auth import BOT_TOKEN, auth_server, init_data
from tests.support.server import client
from tests.support.wallet import sign_in

ALICE = {"id": 7001, "first_name": "Alice", "last_name": "Liddell", "username": "alice"}
BOT = {"FLOWSVC_PLUGINS_AUTH_BOT_TOKEN": BOT_TOKEN,
       "FLOWSVC_PLUGINS_AUTH_MESSENGER_MAX_AGE_SECONDS": "60"}


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def test_messenger_login_creates_then_finds_the_linked_user(tmp_path: Path,
                                                                  database_url: str) -> None:
    async with auth_server(tmp_path, database_url, **BOT) as server, \
            client(server) as first, client(server) as second:
        signed_up = await first.post("/auth/messenger", json={"initData": init_data(ALICE)})
        assert signed_up.status_code == 200, signed_up.text
        user = signed_up.json()["user"]
        assert user["messenger"] == {"id": "7001", "username": "alice",
                                     "firstName": "Alice", "lastName": "Liddell"}
        assert user["displayName"] == "Alice Liddell" and user["address"] is None
        me = await first.get("/me")
        assert me.status_code == 200 and me.json()["user"] == user

        renamed = {**ALICE, "username": "alice_l"}
        again = await second.post("/auth/messenger", json={"initData": init_data(renamed)})
        assert again.status_code == 200
        assert again.json()["user"]["id"] == user["id"]
        # The stored identity follows the platform; the first session's /me sees it at once.
        assert again.json()["user"]["messenger"]["username"] == "alice_l"
        assert (await first.get("/me")).json()["user"]["messenger"]["username"] == "alice_l"


async def test_signed_in_wallet_user_gets_the_identity_linked(tmp_path: Path,
                                                             database_url: str) -> None:
    async with auth_server(tmp_path, database_url, **BOT) as server, client(server) as http:
        wallet, user = await sign_in(http)
        before = await http.get("/me")  # now cached in this process: linking must drop it
        assert "messenger" not in before.json()["user"]
        linked = await http.post("/auth/messenger", json={"initData": init_data(ALICE)})
        assert linked.status_code == 200, linked.text
        body = linked.json()["user"]
        assert (body["id"], body["address"]) == (user["id"], wallet.address.lower())
        assert body["messenger"]["id"] == "7001"
        me = (await http.get("/me")).json()["user"]
        assert me["id"] == user["id"] and me["messenger"]["id"] == "7001"
        async with client(server) as bot:
            via_bot = await bot.post("/auth/messenger", json={"initData": init_data(ALICE)})
            assert via_bot.json()["user"]["id"] == user["id"]
        async with client(server) as someone_else:
            await sign_in(someone_else)
            taken = await someone_else.post("/auth/messenger",
                                            json={"initData": init_data(ALICE)})
            assert _error(taken) == (409, "messenger_linked")


async def test_bad_hash_stale_data_or_no_bot_token_get_telegram_invalid(
        tmp_path: Path, database_url: str) -> None:
    async with auth_server(tmp_path / "bot", database_url, **BOT) as server, \
            client(server) as http:
        cases = {
            "tampered": init_data(ALICE, tamper=True),
            "other bot": init_data(ALICE, bot_token="999:another-bot"),
            "no hash": init_data(ALICE).split("&hash=")[0],
            "non-ascii hash": init_data(ALICE).split("&hash=")[0] + "&hash=%C3%A9",
            "stale": init_data(ALICE, auth_date=int(time.time()) - 120),
            "future": init_data(ALICE, auth_date=int(time.time()) + 10 * 365 * 86400),
            # The hash covers the last "user"; which one a reader takes would be a guess.
            "repeated field": "user=" + quote('{"id":1,"first_name":"Mallory"}') + "&"
                              + init_data(ALICE),
            "garbage": "this is not init data",
        }
        for name, data in cases.items():
            refused = await http.post("/auth/messenger", json={"initData": data})
            assert _error(refused) == (401, "telegram_invalid"), name
            assert "svc_session" not in refused.cookies
        missing = await http.post("/auth/messenger", json={})
        assert _error(missing) == (400, "invalid_request")
    async with auth_server(tmp_path / "nobot", database_url) as server, client(server) as http:
        unconfigured = await http.post("/auth/messenger", json={"initData": init_data(ALICE)})
        assert _error(unconfigured) == (401, "telegram_invalid")


async def test_a_signed_user_id_or_auth_date_out_of_bounds_is_telegram_invalid(
        tmp_path: Path, database_url: str) -> None:
    """Well signed, but not an id the users table can hold or not plain digits: a 401, never
    a 500 (an overflow in the database or in the age check) nor another user."""
    async with auth_server(tmp_path, database_url, **BOT) as server, client(server) as http:
        now = int(time.time())
        cases = {
            "id 10^20": init_data({**ALICE, "id": 10**20}),
            "id 2^63": init_data({**ALICE, "id": 2**63}),
            "id 0": init_data({**ALICE, "id": 0}),
            "negative id": init_data({**ALICE, "id": -7001}),
            "id true": init_data({**ALICE, "id": True}),
            "fractional id": init_data({**ALICE, "id": 7001.9}),
            "id as text": init_data({**ALICE, "id": "7001"}),
            "id in other digits": init_data({**ALICE, "id": "\u0667\u0660\u0660\u0661"}),
            "infinite id": init_data('{"id":Infinity,"first_name":"A"}'),
            "id 1e400": init_data('{"id":1e400,"first_name":"A"}'),
            "user a list": init_data("[7001]"),
            "user nested deep": init_data('{"id":7001,"x":' + "[" * 1200 + "]" * 1200 + "}"),
            "auth_date of 400 digits": init_data(ALICE, auth_date="9" * 400),
            "auth_date in other digits": init_data(ALICE, auth_date="".join(
                chr(0x0660 + int(digit)) for digit in str(now))),
        }
        for name, data in cases.items():
            refused = await http.post("/auth/messenger", json={"initData": data})
            assert _error(refused) == (401, "telegram_invalid"), (name, refused.text)
        largest = await http.post("/auth/messenger",
                                  json={"initData": init_data({**ALICE, "id": 2**63 - 1})})
        assert largest.status_code == 200, largest.text
        assert largest.json()["user"]["messenger"]["id"] == str(2**63 - 1)
