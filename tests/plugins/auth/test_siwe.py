"""SIWE over real HTTP: the message the server builds, every error a bad verify gets, races."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
import trio
from eth_utils.address import to_checksum_address

from runtime.server import Running
from tests.support.auth import auth_server
from tests.support.background import shared_service_fixture
from tests.support.server import client
from tests.support.wallet import new_wallet, sign, sign_in

ISO_MS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


# One auth service per database for the tests that take ``server`` (each signs in a new
# wallet of its own and only talks HTTP, so none depends on another's rows).
server = shared_service_fixture(["auth"])


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, response.json()["error"]["code"]


async def _issue(http: httpx.AsyncClient, address: str) -> dict[str, str]:
    issued = await http.post("/auth/nonce", json={"address": address})
    assert issued.status_code == 200, issued.text
    body: dict[str, str] = issued.json()
    return body


@pytest.mark.filterwarnings("ignore:websockets.legacy is deprecated:DeprecationWarning")
async def test_message_is_standard_eip4361_with_the_configured_fields(
        tmp_path: Path, database_url: str) -> None:
    from siwe import SiweMessage  # imports web3, whose websockets import warns

    async with auth_server(tmp_path, database_url,
                           FLOWSVC_PLUGINS_AUTH_SIWE_DOMAIN="app.flow.test",
                           FLOWSVC_PLUGINS_AUTH_SIWE_URI="https://app.flow.test/login",
                           FLOWSVC_PLUGINS_AUTH_SIWE_CHAIN_ID="97",
                           FLOWSVC_PLUGINS_AUTH_SIWE_STATEMENT="Sign in to FLOW test.") as server, \
            client(server) as http:
        wallet = new_wallet()
        before = datetime.now(UTC).replace(microsecond=0)
        issued = await _issue(http, wallet.address.lower())
        parsed = SiweMessage.from_message(issued["message"])
        assert parsed.address == to_checksum_address(wallet.address) == wallet.address
        assert parsed.address != wallet.address.lower()
        assert (parsed.domain, parsed.uri, parsed.chain_id) == \
            ("app.flow.test", "https://app.flow.test/login", 97)
        assert parsed.statement == "Sign in to FLOW test."
        assert parsed.nonce == issued["nonce"] and len(issued["nonce"]) >= 8
        issued_at = datetime.fromisoformat(parsed.issued_at.replace("Z", "+00:00"))
        expires_at = datetime.fromisoformat(parsed.expiration_time.replace("Z", "+00:00"))
        assert before <= issued_at <= datetime.now(UTC)
        assert expires_at - issued_at == timedelta(minutes=5)
        assert ISO_MS.match(issued["expiresAt"]) and issued["expiresAt"] == parsed.expiration_time
        # The standard parser rebuilds the exact text, and the standard verifier accepts the
        # wallet's signature of it.
        assert parsed.prepare_message() == issued["message"]
        signature = sign(wallet, issued["message"])
        parsed.verify(signature, domain="app.flow.test", nonce=issued["nonce"])
        verified = await http.post("/auth/verify", json={
            "address": wallet.address.lower(), "message": issued["message"],
            "signature": signature})
        assert verified.status_code == 200, verified.text


async def test_first_sign_in_creates_the_user_and_later_ones_find_it(server: Running) -> None:
    async with client(server) as first, client(server) as second:
        wallet, user = await sign_in(first)
        _, again = await sign_in(second, wallet)
    assert again == user
    assert str(user["id"]).isdigit()
    assert user["address"] == wallet.address.lower()
    address = wallet.address.lower()
    assert user["displayName"] == f"{address[:6]}…{address[-4:]}"
    assert "messenger" not in user


async def test_expired_and_unknown_nonces_get_nonce_expired(tmp_path: Path,
                                                            database_url: str) -> None:
    async with auth_server(tmp_path, database_url,
                           FLOWSVC_PLUGINS_AUTH_NONCE_TTL_SECONDS="1") as server, \
            client(server) as http:
        wallet = new_wallet()
        address = wallet.address.lower()
        issued = await _issue(http, address)
        await trio.sleep(1.1)
        late = await http.post("/auth/verify", json={
            "address": address, "message": issued["message"],
            "signature": sign(wallet, issued["message"])})
        assert _error(late) == (401, "nonce_expired")

        made_up = issued["message"].replace(issued["nonce"], "0123456789abcdef" * 2)
        unknown = await http.post("/auth/verify", json={
            "address": address, "message": made_up, "signature": sign(wallet, made_up)})
        assert _error(unknown) == (401, "nonce_expired")


async def test_wrong_or_malformed_signatures_get_signature_invalid(server: Running) -> None:
    async with client(server) as http:
        wallet, other = new_wallet(), new_wallet()
        address = wallet.address.lower()
        issued = await _issue(http, address)
        message = issued["message"]
        for signature in (sign(other, message),       # another wallet signed it
                          "0x" + "00" * 65,            # 65 bytes that recover nothing
                          "0x" + "ab" * 20):           # hex, but not a signature at all
            refused = await http.post("/auth/verify", json={
                "address": address, "message": message, "signature": signature})
            assert _error(refused) == (401, "signature_invalid"), signature
        # Failed attempts do not burn the nonce: the wallet's own signature still works.
        ok = await http.post("/auth/verify", json={
            "address": address, "message": message, "signature": sign(wallet, message)})
        assert ok.status_code == 200
        assert _error(await http.post("/auth/verify", json={
            "address": address, "message": message, "signature": sign(wallet, message)})) == \
            (409, "nonce_used")


async def test_a_message_or_address_not_as_issued_is_refused(server: Running) -> None:
    async with client(server) as http:
        wallet = new_wallet()
        address = wallet.address.lower()
        message = (await _issue(http, address))["message"]
        reworded = message.replace("Sign in to FLOW.", "Sign in to FLOW and send all tokens.")
        assert reworded != message
        changed = await http.post("/auth/verify", json={
            "address": address, "message": reworded, "signature": sign(wallet, reworded)})
        assert _error(changed) == (400, "invalid_request")
        other = new_wallet()
        swapped = await http.post("/auth/verify", json={
            "address": other.address.lower(), "message": message,
            "signature": sign(other, message)})
        assert _error(swapped) == (400, "invalid_request")
        no_nonce = await http.post("/auth/verify", json={
            "address": address, "message": "hello", "signature": sign(wallet, "hello")})
        assert _error(no_nonce) == (400, "invalid_request")


async def test_bad_input_gets_invalid_request_with_details(server: Running) -> None:
    async with client(server) as http:
        for body, field in (({"address": "0x123"}, "address"),
                            ({"address": "not an address at all, really, not one"}, "address"),
                            ({}, "address")):
            refused = await http.post("/auth/nonce", json=body)
            assert _error(refused) == (400, "invalid_request")
            assert field in {d["field"] for d in refused.json()["error"]["details"]}
        wallet = new_wallet()
        address = wallet.address.lower()
        message = (await _issue(http, address))["message"]
        for body, field in (({"address": address, "message": message}, "signature"),
                            ({"address": address, "signature": "0x00"}, "message"),
                            ({"message": message, "signature": "0x00"}, "address"),
                            ({"address": address, "message": message, "signature": "zz"},
                             "signature")):
            refused = await http.post("/auth/verify", json=body)
            assert _error(refused) == (400, "invalid_request"), body
            assert field in {d["field"] for d in refused.json()["error"]["details"]}
        not_json = await http.post("/auth/verify", content=b"{",
                                   headers={"Content-Type": "application/json"})
        assert _error(not_json) == (400, "invalid_request")


async def test_twenty_concurrent_verifies_of_one_nonce_sign_in_once(server: Running) -> None:
    wallet = new_wallet()
    address = wallet.address.lower()
    async with client(server) as http:
        message = (await _issue(http, address))["message"]
        body = {"address": address, "message": message, "signature": sign(wallet, message)}
        answers: list[httpx.Response] = []

        async def verify() -> None:
            answers.append(await http.post("/auth/verify", json=body))

        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(verify)
    assert sorted(answer.status_code for answer in answers) == [200] + [409] * 19
    assert {answer.json()["error"]["code"] for answer in answers
            if answer.status_code == 409} == {"nonce_used"}
    assert sum("svc_session" in answer.cookies for answer in answers) == 1
