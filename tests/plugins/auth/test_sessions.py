"""Sessions over real HTTP: cookie attributes, rotation, bearer tokens, 401s and logout."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import jwt
import trio

from runtime.server import Running
from tests.support.auth import auth_server
from tests.support.background import shared_service_fixture
from tests.support.server import client
from tests.support.wallet import new_wallet, sign, sign_in

SECRET = "test-jwt-secret-" + "x" * 32  # tests.support.server.settings_env's
THIRTY_DAYS = 30 * 24 * 3600


# One auth service per database for the tests that take ``server`` (each signs in a new
# wallet of its own and only talks HTTP, so none depends on another's rows).
server = shared_service_fixture(["auth"])


def _cookie(token: str) -> dict[str, str]:
    """The request header of a session cookie (for clients whose jar is empty)."""
    return {"Cookie": f"svc_session={token}"}


def _cookie_attributes(response: httpx.Response) -> dict[str, str]:
    [header] = response.headers.get_list("set-cookie")
    name_value, *attributes = [part.strip() for part in header.split(";")]
    assert name_value.startswith("svc_session=")
    pairs = (attribute.partition("=") for attribute in attributes)
    return {name.lower(): value for name, _, value in pairs}


async def _unauthenticated(http: httpx.AsyncClient, **kwargs: object) -> bool:
    answer = await http.get("/me", **kwargs)  # type: ignore[arg-type]
    return answer.status_code == 401 and answer.json()["error"]["code"] == "unauthenticated"


async def test_cookie_is_httponly_secure_lax_thirty_days_by_default(tmp_path: Path,
                                                                     database_url: str) -> None:
    async with auth_server(tmp_path, database_url,
                           FLOWSVC_SERVICE_COOKIE_SECURE="true") as server, \
            client(server) as http:
        wallet = new_wallet()
        address = wallet.address.lower()
        message = (await http.post("/auth/nonce", json={"address": address})).json()["message"]
        verified = await http.post("/auth/verify", json={
            "address": address, "message": message, "signature": sign(wallet, message)})
        assert verified.status_code == 200
        attributes = _cookie_attributes(verified)
        assert {"httponly", "secure"} <= attributes.keys()
        assert attributes["samesite"] == "Lax"
        assert attributes["max-age"] == str(THIRTY_DAYS)
        assert attributes["path"] == "/"
        token = verified.cookies["svc_session"]
        claims = jwt.decode(token, SECRET, algorithms=["HS256"])
        assert claims["exp"] - claims["iat"] == THIRTY_DAYS


async def test_logout_clears_the_cookie_and_revokes_cookie_and_bearer(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        token = http.cookies["svc_session"]
        assert (await http.get("/me", headers={"Authorization": f"Bearer {token}"})).status_code \
            == 200
        out = await http.post("/auth/logout")
        assert out.status_code == 204 and out.content == b""
        cleared = _cookie_attributes(out)
        assert cleared["max-age"] == "0" and "httponly" in cleared
        assert "svc_session" not in http.cookies
        assert await _unauthenticated(http, headers=_cookie(token))
        assert await _unauthenticated(http, headers={"Authorization": f"Bearer {token}"})
        second = await http.post("/auth/logout", headers={"Authorization": f"Bearer {token}"})
        assert second.status_code == 401


async def test_missing_forged_or_expired_tokens_get_unauthenticated(server: Running) -> None:
    async with client(server) as http:
        _, user = await sign_in(http)
        token = http.cookies["svc_session"]
        http.cookies.clear()
        claims = jwt.decode(token, SECRET, algorithms=["HS256"])
        now = int(time.time())
        expired = jwt.encode({**claims, "iat": now - 7200, "exp": now - 60}, SECRET)
        forged = jwt.encode(claims, "another-secret-" + "y" * 32)
        tampered = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        assert await _unauthenticated(http)
        for bad in (expired, forged, tampered, "not.a.jwt", "garbage"):
            assert await _unauthenticated(http, headers={"Authorization": f"Bearer {bad}"}), bad
            assert await _unauthenticated(http, headers=_cookie(bad)), bad
        assert (await http.post("/auth/logout")).status_code == 401
        # A token accepted once is still refused the moment it expires (no memo outlives it).
        expires = int(time.time()) + 2
        soon = jwt.encode({**claims, "exp": expires}, SECRET)
        ok = await http.get("/me", headers={"Authorization": f"Bearer {soon}"})
        assert ok.status_code == 200 and ok.json()["user"]["id"] == user["id"]
        await trio.sleep(expires - time.time() + 0.05)
        assert await _unauthenticated(http, headers={"Authorization": f"Bearer {soon}"})


async def test_an_old_cookie_is_rotated_and_logout_revokes_both_tokens(
        tmp_path: Path, database_url: str) -> None:
    async with auth_server(tmp_path, database_url,
                           FLOWSVC_JWT_ROTATE_AFTER_HOURS="0.0001") as server, \
            client(server) as http:
        await sign_in(http)
        old = http.cookies["svc_session"]
        await trio.sleep(1.1)  # past 0.36 s, and a new second for the new token's iat
        async with client(server) as other:
            # Signing in with a cookie due for rotation sets the new session's cookie only.
            wallet = new_wallet()
            address = wallet.address.lower()
            message = (await other.post("/auth/nonce", json={"address": address})
                       ).json()["message"]
            fresh = await other.post("/auth/verify", headers=_cookie(old), json={
                "address": address, "message": message, "signature": sign(wallet, message)})
            assert fresh.status_code == 200
            _cookie_attributes(fresh)  # exactly one Set-Cookie
            assert jwt.decode(fresh.cookies["svc_session"], SECRET, algorithms=["HS256"])["sub"] \
                == fresh.json()["user"]["id"]
        rotated_response = await http.get("/me")
        assert rotated_response.status_code == 200
        attributes = _cookie_attributes(rotated_response)
        assert attributes["max-age"] == str(THIRTY_DAYS) and "httponly" in attributes
        new = http.cookies["svc_session"]
        assert new != old
        old_claims, new_claims = (jwt.decode(t, SECRET, algorithms=["HS256"]) for t in (old, new))
        assert new_claims["sid"] == old_claims["sid"] and new_claims["iat"] > old_claims["iat"]
        async with client(server) as other:
            still = await other.get("/me", headers=_cookie(old))
            assert still.status_code == 200
            # A bearer token is never rotated: its holder could not store a new cookie.
            bearer = await other.get("/me", headers={"Authorization": f"Bearer {old}"})
            assert "set-cookie" not in bearer.headers
        assert (await http.post("/auth/logout")).status_code == 204
        async with client(server) as other:
            for token in (old, new):
                assert await _unauthenticated(other, headers=_cookie(token))
