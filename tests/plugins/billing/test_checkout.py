"""Checkout to activation over real HTTP, through the fake providers' real formats, and the
callbacks that must change nothing: forged, stale, replayed, repeated."""

from __future__ import annotations

import time
from decimal import Decimal
from pathlib import Path

import httpx

from tests.support.billing import TREASURY, USDT_TOKEN, Stack, billing_stack, subscription
from tests.support.fake_provider import deliver
from tests.support.marketplace import signed_in
from tests.support.server import client

NONE_FEATURES = {"priorityQueue": False, "premiumAgents": False, "fasterSse": False,
                 "privateProjects": False, "dedicatedRuntime": False}


def code(response: httpx.Response) -> str:
    return str(response.json()["error"]["code"])


async def payments_of(http: httpx.AsyncClient) -> list[dict[str, object]]:
    answer = await http.get("/me/subscription/payments")
    assert answer.status_code == 200, answer.text
    payments: list[dict[str, object]] = answer.json()["payments"]
    return payments


async def test_crypto_bot_checkout_activates_once_on_a_verified_callback(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, user_id), client(stack.running) as anonymous:
        assert (await anonymous.post("/subscriptions/checkout", json={
            "tier": "plus", "provider": "crypto_bot"})).status_code == 401
        never = await subscription(http)
        assert never == {"subscriptionId": None, "tier": "none", "status": "none",
                         "renewsAt": None, "provider": None, "features": NONE_FEATURES,
                         "nextTier": None, "periodStart": None, "endsAt": None,
                         "graceEndsAt": None, "openInvoice": None}
        unknown_tier = await http.post("/subscriptions/checkout",
                                       json={"tier": "gold", "provider": "crypto_bot"})
        assert unknown_tier.status_code == 400 and code(unknown_tier) == "tier_unknown"
        unknown_provider = await http.post("/subscriptions/checkout",
                                           json={"tier": "plus", "provider": "paypal"})
        assert unknown_provider.status_code == 400
        assert code(unknown_provider) == "provider_unsupported"

        key = {"Idempotency-Key": "checkout-1"}
        started = await http.post("/subscriptions/checkout", headers=key,
                                  json={"tier": "plus", "provider": "crypto_bot"})
        assert started.status_code == 201, started.text
        body = started.json()
        assert set(body) >= {"subscriptionId", "tier", "provider", "checkoutUrl", "expiresAt"}
        assert (body["tier"], body["provider"], body["amountUsd"]) == \
            ("plus", "crypto_bot", "20.000000")
        again = await http.post("/subscriptions/checkout", headers=key,
                                json={"tier": "plus", "provider": "crypto_bot"})
        assert again.json() == body and again.headers["Idempotent-Replayed"] == "true"
        assert len(stack.cryptopay.created) == 1
        created = stack.cryptopay.created[0]
        assert created["payload"] == f"{body['invoiceId']}:{body['subscriptionId']}"
        assert (created["currency_type"], created["fiat"]) == ("fiat", "USD")
        assert (await subscription(http))["status"] == "none"  # nothing before payment

        invoice_id = stack.cryptopay.invoice_of_url(body["checkoutUrl"])
        delivery, headers = stack.cryptopay.signed_update(invoice_id)
        forged = await deliver(stack.cryptopay.webhook_url, delivery,
                               {"crypto-pay-api-signature": "0" * 64})
        assert forged.status_code == 401 and code(forged) == "callback_signature_invalid"
        unsigned = await deliver(stack.cryptopay.webhook_url, delivery, {})
        assert unsigned.status_code == 401 and code(unsigned) == "callback_signature_invalid"
        assert (await subscription(http))["status"] == "none"

        paid = await deliver(stack.cryptopay.webhook_url, delivery, headers)
        assert paid.status_code == 200 and paid.json() == {"received": True,
                                                           "outcome": "granted"}
        active = await subscription(http)
        assert (active["tier"], active["status"], active["provider"]) == \
            ("plus", "active", "crypto_bot")
        assert active["features"] == {**NONE_FEATURES, "priorityQueue": True}
        assert "monthlyGrantFlow" not in active and "currentGrantRemainingFlow" not in active

        replayed = await deliver(stack.cryptopay.webhook_url, delivery, headers)
        assert replayed.status_code == 409 and code(replayed) == "callback_replayed"
        second_update = await stack.cryptopay.pay(invoice_id)  # a new update, same invoice
        assert second_update.status_code == 200
        assert second_update.json()["outcome"] == "repeated"
        assert [p["outcome"] for p in await payments_of(http)] == ["granted"]
        assert stack.named("subscription.granted", user_id) == [{
            "tier": "plus", "amount_flow": "0.000000", "purpose": "checkout",
            "renews_at": active["renewsAt"], "subscription_id": body["subscriptionId"]}]
        received = stack.named("payment.received", user_id)
        assert len(received) == 1 and received[0]["amount_usd"] == "20.000000"
        assert (received[0]["provider"], received[0]["amount_flow"]) == \
            ("crypto_bot", "0.000000")

        twice = await http.post("/subscriptions/checkout",
                                json={"tier": "max", "provider": "crypto_bot"})
        assert twice.status_code == 409 and code(twice) == "subscription_active"


async def gateway_session(stack: Stack, http: httpx.AsyncClient, tier: str) -> str:
    started = await http.post("/subscriptions/checkout",
                              json={"tier": tier, "provider": "gateway"})
    assert started.status_code == 201, started.text
    return stack.gateway.session_of_url(started.json()["checkoutUrl"])


async def test_gateway_checkout_verifies_timestamped_signatures(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, _):
        session_id = await gateway_session(stack, http, "pro")
        session = stack.gateway.sessions[session_id]
        assert (session["amount_total"], session["currency"], session["mode"]) == \
            (10000, "usd", "payment")
        url = stack.gateway.webhook_url
        stale_body, stale = stack.gateway.signed_event(session_id,
                                                       timestamp=int(time.time()) - 400)
        refused = await deliver(url, stale_body, stale)
        assert refused.status_code == 400 and code(refused) == "callback_stale"
        forged_body, forged = stack.gateway.signed_event(session_id, secret="whsec_other")
        refused = await deliver(url, forged_body, forged)
        assert refused.status_code == 401 and code(refused) == "callback_signature_invalid"
        assert (await subscription(http))["status"] == "none"

        body, headers = stack.gateway.signed_event(session_id)
        # Several v1 (a secret being rolled): any one may match.
        headers = {"stripe-signature": headers["stripe-signature"].replace(
            "v1=", "v1=" + "0" * 64 + ",v1=")}
        paid = await deliver(url, body, headers)
        assert paid.status_code == 200 and paid.json()["outcome"] == "granted", paid.text
        replayed = await deliver(url, body, headers)
        assert replayed.status_code == 409 and code(replayed) == "callback_replayed"
        late_body, late = stack.gateway.signed_event(
            session_id, event_type="checkout.session.async_payment_succeeded")
        again = await deliver(url, late_body, late)
        assert again.status_code == 200 and again.json()["outcome"] == "repeated"
        active = await subscription(http)
        assert (active["tier"], active["status"], active["provider"]) == \
            ("pro", "active", "gateway")
        assert active["features"] == {**NONE_FEATURES, "priorityQueue": True,
                                      "premiumAgents": True, "fasterSse": True}
        assert [p["outcome"] for p in await payments_of(http)] == ["granted"]


async def test_usdt_checkout_answers_a_unique_exact_amount_to_the_treasury(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (first, _), signed_in(stack.running) as (second, _):
        answers = []
        for http in (first, second):
            started = await http.post("/subscriptions/checkout",
                                      json={"tier": "max", "provider": "usdt_bep20"})
            assert started.status_code == 201, started.text
            answers.append(started.json())
        amounts = {answer["payment"]["amount"] for answer in answers}
        assert len(amounts) == 2
        for answer in answers:
            payment = answer["payment"]
            assert (payment["chainId"], payment["token"], payment["address"]) == \
                (56, USDT_TOKEN, TREASURY)
            assert Decimal("200") < Decimal(payment["amount"]) < Decimal("200.1")
            base_units = int(Decimal(payment["amount"]) * 10**18)
            assert answer["checkoutUrl"] == (f"ethereum:{USDT_TOKEN}@56/transfer?address="
                                             f"{TREASURY}&uint256={base_units}")
