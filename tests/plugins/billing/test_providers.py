"""Callback verification of the HTTP providers, at its edges (the formats are built here
from the providers' documentation, not with the plugin's own signing helpers)."""

from __future__ import annotations

import hashlib
import hmac
import json

import pytest

from plugins.billing.errors import CallbackSignatureInvalid, CallbackStale
from plugins.billing.providers.crypto_bot import CryptoBot
from plugins.billing.providers.gateway import Gateway
from runtime.errors import InvalidRequest

SECRET = "whsec_unit"
NOW = 1_800_000_000
EVENT = json.dumps({"id": "evt_1", "type": "payment_intent.created", "created": NOW,
                    "data": {"object": {"id": "pi_1"}}}).encode()


def stripe_header(body: bytes, moment: int, secret: str = SECRET) -> dict[str, str]:
    v1 = hmac.new(secret.encode(), f"{moment}.".encode() + body, hashlib.sha256).hexdigest()
    return {"stripe-signature": f"t={moment},v1={v1}"}


GATEWAY = Gateway("http://127.0.0.1:9", "sk_unit", SECRET, "http://127.0.0.1:9/back", 1.0)


@pytest.mark.parametrize("age", [-300, 0, 300])
def test_gateway_accepts_timestamps_within_300_seconds(age: int) -> None:
    confirmation = GATEWAY.verify_callback(stripe_header(EVENT, NOW - age), EVENT, NOW)
    assert (confirmation.event_id, confirmation.payment) == ("evt_1", None)  # pays nothing


@pytest.mark.parametrize("age", [-301, 301])
def test_gateway_refuses_older_or_newer_timestamps(age: int) -> None:
    with pytest.raises(CallbackStale):
        GATEWAY.verify_callback(stripe_header(EVENT, NOW - age), EVENT, NOW)


@pytest.mark.parametrize("header", ["", "t=1800000000", "v1=abc", "t=x,v1=abc",
                                    "t=1800000000,v1=ünicode", "t=١٨٠٠٠٠٠٠٠٠,v1=abc"])
def test_gateway_refuses_malformed_signature_headers(header: str) -> None:
    with pytest.raises(CallbackSignatureInvalid):
        GATEWAY.verify_callback({"stripe-signature": header}, EVENT, NOW)


def test_gateway_refuses_a_body_changed_after_signing() -> None:
    headers = stripe_header(EVENT, NOW)
    with pytest.raises(CallbackSignatureInvalid):
        GATEWAY.verify_callback(headers, EVENT.replace(b"evt_1", b"evt_2"), NOW)


def test_crypto_bot_checks_the_raw_body_then_reads_it() -> None:
    token = "1:unit"
    bot = CryptoBot("http://127.0.0.1:9", token, "", 1.0)
    key = hashlib.sha256(token.encode()).digest()

    def signed(body: bytes) -> dict[str, str]:
        return {"crypto-pay-api-signature": hmac.new(key, body, hashlib.sha256).hexdigest()}

    other = json.dumps({"update_id": 7, "update_type": "invoice_expired",
                        "request_date": "2026-01-01T00:00:00Z", "payload": {}}).encode()
    assert bot.verify_callback(signed(other), other, NOW).payment is None
    with pytest.raises(CallbackSignatureInvalid):  # keyed with the token itself: wrong
        bot.verify_callback({"crypto-pay-api-signature": hmac.new(
            token.encode(), other, hashlib.sha256).hexdigest()}, other, NOW)
    garbage = b'{"update_id": "x"}'
    with pytest.raises(InvalidRequest):
        bot.verify_callback(signed(garbage), garbage, NOW)


def test_gateway_refuses_a_signed_timestamp_of_hundreds_of_digits() -> None:
    moment = 10**400
    with pytest.raises(CallbackSignatureInvalid):  # not an OverflowError in the age check
        GATEWAY.verify_callback(stripe_header(EVENT, moment), EVENT, NOW)
