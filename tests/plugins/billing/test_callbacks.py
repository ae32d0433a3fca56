"""Callbacks that are correctly signed but must not grant, over real HTTP: a payment naming
an invoice of another provider or a checkout the service never opened, an amount that is
not exact, and bodies that are not what the provider sends (each a 4xx with the envelope,
changing nothing). Signed with the fakes' own signers, as the providers document."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path
from typing import Any

import httpx

from tests.support.billing import INTERNAL, Stack, billing_stack, subscription
from tests.support.fake_provider import deliver
from tests.support.marketplace import signed_in
from tests.support.server import client


def _error(response: httpx.Response) -> tuple[int, str]:
    return response.status_code, str(response.json()["error"]["code"])


async def _checkout(http: httpx.AsyncClient, tier: str, provider: str) -> dict[str, Any]:
    started = await http.post("/subscriptions/checkout", json={"tier": tier, "provider": provider})
    assert started.status_code == 201, started.text
    body: dict[str, Any] = started.json()
    return body


def _session_event(session: dict[str, Any], **changes: Any) -> bytes:
    """A ``checkout.session.completed`` event of a paid ``session``, changed as given."""
    paid = {**session, "status": "complete", "payment_status": "paid",
            "customer": "cus_test", **changes}
    return json.dumps({"id": f"evt_{secrets.token_hex(8)}", "object": "event",
                       "type": "checkout.session.completed", "created": int(time.time()),
                       "data": {"object": paid}}).encode()


async def _to_gateway(stack: Stack, body: bytes) -> httpx.Response:
    return await deliver(stack.gateway.webhook_url, body, stack.gateway.sign(body))


async def _to_cryptopay(stack: Stack, body: bytes) -> httpx.Response:
    return await deliver(stack.cryptopay.webhook_url, body, stack.cryptopay.sign(body))


async def _unmatched_payments(stack: Stack) -> list[dict[str, Any]]:
    async with client(stack.running, headers=INTERNAL) as ops:
        answer = await ops.get("/internal/billing/payments", params={"outcome": "unmatched"})
    assert answer.status_code == 200, answer.text
    payments: list[dict[str, Any]] = answer.json()["payments"]
    return payments


async def test_a_callback_settles_only_the_checkout_its_provider_opened(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, _), signed_in(stack.running) as (other, _):
        crypto = await _checkout(http, "max", "crypto_bot")
        gateway_session = stack.gateway.session_of_url(
            (await _checkout(other, "plus", "gateway"))["checkoutUrl"])
        issued = stack.gateway.sessions[gateway_session]

        def never_issued() -> dict[str, Any]:
            return {**issued, "id": f"cs_test_{secrets.token_hex(12)}"}

        # The gateway names the crypto_bot invoice, in a session the service never opened.
        other_provider = _session_event(never_issued(), amount_total=20000,
                                        client_reference_id=crypto["invoiceId"])
        # The gateway names its own invoice, but through another session.
        other_session = _session_event(never_issued())
        # The crypto bot names the gateway invoice, from a bot invoice never created.
        stranger = {"invoice_id": 99999, "status": "paid", "fiat": "USD", "amount": "20.00",
                    "payload": f"{issued['client_reference_id']}:1"}
        crypto_update = json.dumps({"update_id": 777, "update_type": "invoice_paid",
                                    "request_date": "2026-11-26T00:00:00Z",
                                    "payload": stranger}).encode()
        for sent in (await _to_gateway(stack, other_provider),
                     await _to_gateway(stack, other_session),
                     await _to_cryptopay(stack, crypto_update)):
            assert sent.status_code == 200 and sent.json()["outcome"] == "unmatched", sent.text
        for someone in (http, other):
            shown = await subscription(someone)
            assert (shown["status"], shown["tier"]) == ("none", "none")
        unmatched = await _unmatched_payments(stack)
        assert len(unmatched) == 3
        assert all(payment["invoiceId"] is None and payment["userId"] is None
                   for payment in unmatched)
        assert stack.named("subscription.granted") == []

        # The sessions it did open still pay their invoices.
        paid = await stack.gateway.complete(gateway_session)
        assert paid.json()["outcome"] == "granted", paid.text
        bot_invoice = stack.cryptopay.invoice_of_url(crypto["checkoutUrl"])
        assert (await stack.cryptopay.pay(bot_invoice)).json()["outcome"] == "granted"
        assert (await subscription(http))["tier"] == "max"


async def test_an_amount_is_exact_or_refused(tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, _):
        session_id = stack.gateway.session_of_url(
            (await _checkout(http, "plus", "gateway"))["checkoutUrl"])
        session = stack.gateway.sessions[session_id]
        assert session["amount_total"] == 2000
        for amount in (2000.9, 2000.0, 1999.5, "2000", True):
            refused = await _to_gateway(stack, _session_event(session, amount_total=amount))
            assert _error(refused) == (400, "invalid_request"), (amount, refused.text)
            assert refused.json()["error"]["details"][0]["field"] == "data.object.amount_total"
        assert (await subscription(http))["status"] == "none"
        short = await _to_gateway(stack, _session_event(session, amount_total=1999))
        assert short.json()["outcome"] == "short"
        assert (await subscription(http))["status"] == "none"

        crypto = await _checkout(http, "plus", "crypto_bot")
        bot_invoice = stack.cryptopay.invoice_of_url(crypto["checkoutUrl"])
        invoice = stack.cryptopay.invoices[bot_invoice]
        for index, amount in enumerate(("20.0000001", "20,00", "２０", 20, "-20")):
            body = json.dumps({"update_id": 9000 + index, "update_type": "invoice_paid",
                               "payload": {**invoice, "status": "paid", "amount": amount}})
            refused = await _to_cryptopay(stack, body.encode())
            assert _error(refused) == (400, "invalid_request"), (amount, refused.text)
        assert (await subscription(http))["status"] == "none"
        assert (await stack.cryptopay.pay(bot_invoice)).json()["outcome"] == "granted"


async def test_a_signed_but_malformed_callback_is_a_4xx_that_changes_nothing(
        tmp_path: Path, database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            signed_in(stack.running) as (http, _):
        crypto = await _checkout(http, "plus", "crypto_bot")
        bot_invoice = stack.cryptopay.invoice_of_url(crypto["checkoutUrl"])
        invoice = {**stack.cryptopay.invoices[bot_invoice], "status": "paid"}
        session_id = stack.gateway.session_of_url(
            (await _checkout(http, "plus", "gateway"))["checkoutUrl"])
        session = stack.gateway.sessions[session_id]

        deep = b'{"id": "evt_deep", "type": "x", "data": ' + b"[" * 100_000 \
            + b"]" * 100_000 + b"}"
        gateway_bodies = {
            "amount Infinity": _session_event(session).replace(
                b'"amount_total": 2000', b'"amount_total": Infinity'),
            "amount NaN": _session_event(session).replace(
                b'"amount_total": 2000', b'"amount_total": NaN'),
            "amount 1e30": _session_event(session).replace(
                b'"amount_total": 2000', b'"amount_total": 1e30'),
            "amount 10^30": _session_event(session, amount_total=10**30),
            "amount string Infinity": _session_event(session, amount_total="Infinity"),
            "nested 100000 deep": deep,
            "data a list": json.dumps({"id": "evt_1", "type": "checkout.session.completed",
                                       "data": [session]}).encode(),
            "object a list": json.dumps({"id": "evt_2", "type": "checkout.session.completed",
                                         "data": {"object": [session]}}).encode(),
            "event a list": json.dumps([session]).encode(),
            "event id an object": json.dumps({"id": {"x": 1}, "type": "x",
                                              "data": {"object": {}}}).encode(),
            "event id too long": json.dumps({"id": "e" * 300, "type": "x",
                                             "data": {"object": {}}}).encode(),
            "session id a list": _session_event(session, id=[session_id]),
            "customer a number": _session_event(session, customer=5),
            "NUL in a field": _session_event(session, customer="cus_\u0000"),
            "not JSON": b"\xff\xfe{",
        }
        for name, body in gateway_bodies.items():
            refused = await _to_gateway(stack, body)
            assert refused.status_code == 400, (name, refused.text)
            assert refused.json()["error"]["code"] == "invalid_request", name

        def update(payload: Any, **fields: Any) -> bytes:
            return json.dumps({"update_id": 4242, "update_type": "invoice_paid",
                               "payload": payload, **fields}).encode()

        crypto_bodies = {
            "amount Infinity": update({**invoice, "amount": "Infinity"}),
            "amount NaN": update({**invoice, "amount": "NaN"}),
            "amount 1e30": update({**invoice, "amount": "1e30"}),
            "amount a number 1e30": update(invoice).replace(
                f'"amount": "{invoice["amount"]}"'.encode(), b'"amount": 1e30'),
            "payload a list": update([invoice]),
            "payload a string": update("paid"),
            "invoice_id a float": update({**invoice, "invoice_id": 1.5}),
            "invoice_id 10^30": update({**invoice, "invoice_id": 10**30}),
            "update_id 10^30": update(invoice, update_id=10**30),
            "update_id a string": update(invoice, update_id="4242"),
            "our payload a list": update({**invoice, "payload": [1, 2]}),
            "nested 100000 deep": b'{"update_id": 1, "payload": ' + b"[" * 100_000
            + b"]" * 100_000 + b"}",
        }
        for name, body in crypto_bodies.items():
            refused = await _to_cryptopay(stack, body)
            assert refused.status_code == 400, (name, refused.text)
            assert refused.json()["error"]["code"] == "invalid_request", name

        assert (await subscription(http))["status"] == "none"
        assert stack.named("payment.received") == []
        # Nothing was recorded as processed: the genuine callbacks still pay.
        assert (await stack.cryptopay.pay(bot_invoice)).json()["outcome"] == "granted"


async def test_the_test_clock_takes_a_number_of_seconds_only(tmp_path: Path,
                                                             database_url: str) -> None:
    async with billing_stack(tmp_path / "var", database_url) as stack, \
            client(stack.running, headers=INTERNAL) as ops:
        for value in (True, "60", None, [60]):
            refused = await ops.post("/internal/billing/clock", json={"advanceSeconds": value})
            assert _error(refused) == (400, "invalid_request"), value
        assert (await ops.get("/internal/billing/clock")).json()["offsetSeconds"] == 0
        moved = await ops.post("/internal/billing/clock", json={"advanceSeconds": 60})
        assert moved.json()["offsetSeconds"] == 60
        moved = await ops.post("/internal/billing/clock", json={"advanceSeconds": 0.5})
        assert moved.json()["offsetSeconds"] == 60.5
