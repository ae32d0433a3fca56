"""The console's sign-in and keys pages, in headless Chromium and over plain HTTP.

The browser test goes the way a person does: ``/`` leads to the sign-in page, an injected
EIP-1193 wallet signs the SIWE message with a known key, a key is created and shown once,
then revoked, after which the key itself gets 401 from the API. Chromium resolves no host but
the service's address, and every request it made is checked to go there.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import trio

from plugins.auth.identities import new_access_codes
from runtime.server import Running
from tests.support.chromium import chromium
from tests.support.console import fill, foreign_requests, inject_wallet, serve_wallet
from tests.support.server import client
from tests.support.wallet import new_wallet, sign_in

OFFLINE = "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"


async def _status_with_key(server: Running, raw_key: str) -> int:
    async with client(server) as http:
        return (await http.get("/me", headers={"x-api-key": raw_key})).status_code


async def test_wallet_sign_in_then_a_key_shown_once_and_revoked(server: Running,
                                                                 tmp_path: Path) -> None:
    account = new_wallet()
    base = server.base_url
    async with chromium(tmp_path / "profile", OFFLINE) as browser, trio.open_nursery() as tasks:
        await inject_wallet(browser, account)
        await tasks.start(serve_wallet, browser, account)
        await browser.navigate(f"{base}/")
        assert await browser.evaluate("location.pathname") == "/console/sign-in"
        await browser.wait_for("!document.getElementById('wallet-sign-in').disabled")
        await browser.evaluate("document.getElementById('wallet-sign-in').click()")
        await browser.wait_for("location.pathname === '/console/keys' && "
                               "document.readyState === 'complete'")
        shown = await browser.evaluate("document.querySelector('header .who').textContent")
        address = account.address.lower()
        assert shown == f"{address[:6]}…{address[-4:]}"  # the displayName of the address

        await browser.load_by(fill("#create-key", {"name": "from the console",
                                                   "rate_limit_rpm": "30"}))
        raw_key = await browser.evaluate("document.getElementById('raw-key').textContent")
        assert raw_key.startswith("sk_live_")
        created = [event["params"]["response"] for event in browser.events
                   if event.get("method") == "Network.responseReceived"
                   and event["params"]["response"]["url"] == f"{base}/console/keys"
                   and event["params"]["response"]["status"] == 201]
        assert created and created[0]["headers"]["cache-control"] == "no-store"
        assert await _status_with_key(server, raw_key) == 200

        await browser.navigate(f"{base}/console/keys")  # a GET never shows it again
        html = await browser.evaluate("document.documentElement.outerHTML")
        assert raw_key not in html and "from the console" in html
        assert raw_key[:12] not in html or raw_key[:12] + "…" in html

        await browser.load_by("document.querySelector('button[aria-label=\"Revoke from the "
                              "console\"]').click()")
        assert "from the console" not in await browser.evaluate("document.body.textContent")
        assert await _status_with_key(server, raw_key) == 401

        await browser.load_by("document.querySelector('header form button').click()")
        assert await browser.evaluate("location.pathname") == "/console/sign-in"
        assert await browser.evaluate("document.querySelector('header .who')") is None
        tasks.cancel_scope.cancel()
    assert foreign_requests(browser, base) == []


def _csrf_field(html: str) -> str:
    match = re.search(r'name="csrf" value="([^"]+)"', html)
    assert match is not None
    return match.group(1)


async def test_forms_without_their_csrf_token_are_refused(server: Running) -> None:
    async with client(server) as http:
        await sign_in(http)
        page = await http.get("/console/keys")
        assert page.status_code == 200
        token = _csrf_field(page.text)
        assert http.cookies.get("console_csrf") == token
        for form in ({"name": "no token"}, {"name": "wrong token", "csrf": token[:-1] + "x"}):
            refused = await http.post("/console/keys", data=form)
            assert refused.status_code == 403
            assert refused.json()["error"]["code"] == "csrf_refused"
        async with client(server, cookies={"svc_session": http.cookies["svc_session"]}
                          ) as cookieless:
            without_cookie = await cookieless.post("/console/keys",
                                                   data={"name": "no cookie", "csrf": token})
            assert without_cookie.status_code == 403
        assert (await http.get("/me/api-keys")).json()["keys"] == []
        made = await http.post("/console/keys", data={"name": "with token", "csrf": token})
        assert made.status_code == 201 and made.headers["cache-control"] == "no-store"
        assert len((await http.get("/me/api-keys")).json()["keys"]) == 1


async def test_pages_send_a_csp_whose_nonce_is_on_their_scripts(server: Running) -> None:
    async with client(server) as http:
        page = await http.get("/console/sign-in")
    policy = page.headers["content-security-policy"]
    nonce = re.search(r"'nonce-([^']+)'", policy)
    assert nonce is not None and "default-src 'none'" in policy
    scripts = re.findall(r"<script([^>]*)>", page.text)
    assert scripts and all(f'nonce="{nonce.group(1)}"' in script for script in scripts)
    async with client(server) as http:
        again = await http.get("/console/sign-in")
    assert nonce.group(0) not in again.headers["content-security-policy"]


async def test_another_users_keys_are_never_reachable(server: Running) -> None:
    async with client(server) as owner, client(server) as other:
        await sign_in(owner)
        made = await owner.post("/me/api-keys", json={"name": "owner's key"})
        key = made.json()["key"]
        await sign_in(other)
        page = await other.get("/console/keys")
        assert "owner&#39;s key" not in page.text and key["prefix"] not in page.text
        token = _csrf_field(page.text)
        for action in ("revoke", "limits"):
            refused = await other.post(f"/console/keys/{key['id']}/{action}",
                                       data={"csrf": token, "rate_limit_rpm": "1"})
            assert refused.status_code == 404
            assert "not_found" in refused.text
        assert (await owner.get("/me", headers={"x-api-key": key["raw_key"]})).status_code \
            == 200
        assert (await owner.get("/me/api-keys")).json()["keys"][0]["rate_limit_rpm"] == 60


async def test_an_access_code_signs_in_and_signing_out_ends_the_session(server: Running
                                                                        ) -> None:
    [code] = await server.service.db.write(new_access_codes, 1)
    async with client(server) as http:
        start = await http.get("/")
        assert start.status_code == 303 and start.headers["location"] == "/console/"
        assert (await http.get("/console/")).headers["location"] == "/console/sign-in"
        token = _csrf_field((await http.get("/console/sign-in")).text)
        wrong = await http.post("/console/sign-in/access-code",
                                data={"csrf": token, "code": "ac_not-a-code"})
        assert wrong.status_code == 401 and "code_invalid" in wrong.text
        signed = await http.post("/console/sign-in/access-code",
                                 data={"csrf": token, "code": code})
        assert signed.status_code == 303 and signed.headers["location"] == "/console/keys"
        assert (await http.get("/me")).status_code == 200
        out = await http.post("/console/sign-out", data={"csrf": token})
        assert out.status_code == 303
        assert (await http.get("/me")).status_code == 401
        assert (await http.get("/console/keys")).headers["location"] == "/console/sign-in"


async def test_a_page_is_refused_to_an_api_key(server: Running) -> None:
    """An API key is a caller of the API, not of the console's forms: with no CSRF cookie a
    key-authenticated form post is refused before anything is called."""
    async with client(server) as http:
        await sign_in(http)
        raw = (await http.post("/me/api-keys", json={"name": "k"})).json()["key"]["raw_key"]
    async with httpx.AsyncClient(base_url=server.base_url) as bare:
        refused = await bare.post("/console/keys", data={"name": "x"},
                                  headers={"x-api-key": raw})
        assert refused.status_code == 403
