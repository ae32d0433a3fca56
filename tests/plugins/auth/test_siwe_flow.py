"""End to end: a wallet signs in with SIWE, uses its session, logs out (SQLite and PostgreSQL)."""

from __future__ import annotations

from runtime.server import Running
from tests.support.background import shared_service_fixture
from tests.support.server import client
from tests.support.wallet import new_wallet, sign, sign_in

# One auth service per database for the tests that take ``server`` (each signs in a new
# wallet of its own and only talks HTTP, so none depends on another's rows).
server = shared_service_fixture(["auth"])


async def test_wallet_signs_in_and_logout_revokes(server: Running) -> None:
    async with client(server) as http:
        wallet, user = await sign_in(http)
        assert user["address"] == wallet.address.lower()
        assert isinstance(user["id"], str) and user["id"].isdigit()
        token = http.cookies["svc_session"]
        me = await http.get("/me")
        assert me.status_code == 200
        assert me.json()["user"]["id"] == user["id"]
        async with client(server) as bearer_only:
            bearer = await bearer_only.get("/me", headers={"Authorization": f"Bearer {token}"})
            assert bearer.status_code == 200
        out = await http.post("/auth/logout")
        assert out.status_code == 204
        assert out.content == b""
    async with client(server) as fresh:
        again = await fresh.get("/me", headers={"Authorization": f"Bearer {token}"})
        assert again.status_code == 401
        assert again.json()["error"]["code"] == "unauthenticated"


async def test_nonce_is_single_use(server: Running) -> None:
    async with client(server) as http:
        wallet = new_wallet()
        address = wallet.address.lower()
        message = (await http.post("/auth/nonce", json={"address": address})).json()["message"]
        body = {"address": address, "message": message, "signature": sign(wallet, message)}
        assert (await http.post("/auth/verify", json=body)).status_code == 200
        second = await http.post("/auth/verify", json=body)
        assert second.status_code == 409
        assert second.json()["error"]["code"] == "nonce_used"
