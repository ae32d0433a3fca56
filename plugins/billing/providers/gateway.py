"""``gateway``: a payment gateway in the style of Stripe Checkout.

Checkout creates a hosted session (``POST /v1/checkout/sessions``, form-encoded, the secret
key as a bearer token, ``client_reference_id`` = our invoice id, the card saved for
off-session use) and answers its ``url``. The confirmation is the signed event
``checkout.session.completed`` with ``payment_status: paid`` (or
``checkout.session.async_payment_succeeded`` for delayed methods), in the header
``Stripe-Signature: t=<unix>,v1=<hex>[,v1=...]``: the hex HMAC-SHA256, keyed with the
webhook secret, of ``"<t>.<raw body>"``; any ``v1`` may match and ``t`` must be within 300
seconds of now. A paid session settles only the invoice its ``client_reference_id`` names
if that invoice was opened as this very session (its ``id``), at ``amount_total`` exactly:
an integer of cents. Renewals and upgrades charge the saved card off-session
(``POST /v1/payment_intents`` with ``off_session=true, confirm=true``), with our invoice
as the ``Idempotency-Key`` so that a renewal retried after a crash never charges twice.
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from plugins.billing.errors import CallbackSignatureInvalid, CallbackStale
from plugins.billing.providers import (
    MAX_AMOUNT_MICRO,
    CallbackModel,
    ChargeDeclined,
    Confirmation,
    Opened,
    Order,
    Payment,
    Reference,
    answer_json,
    callback_json,
    our_invoice_id,
    read_callback,
    send,
)
from plugins.billing.tiers import MICRO_PER_CENT
from runtime.errors import InvalidRequest, Unavailable

SIGNATURE_HEADER = "stripe-signature"
TOLERANCE_SECONDS = 300
PAID_EVENTS = ("checkout.session.completed", "checkout.session.async_payment_succeeded")


class _EventData(CallbackModel):
    object: dict[str, Any]


class _Event(CallbackModel):
    id: Reference
    type: str
    data: _EventData


class _PaidSession(CallbackModel):
    """What a paid session must carry; ``amount_total`` is whole cents."""

    id: Reference
    currency: str
    amount_total: int = Field(ge=0, le=MAX_AMOUNT_MICRO // MICRO_PER_CENT)
    client_reference_id: str | None = None
    customer: Reference | None = None


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The hex ``v1`` signature of ``body`` sent at ``timestamp``."""
    return hmac.new(secret.encode(), f"{timestamp}.".encode() + body,
                    hashlib.sha256).hexdigest()


def _parse_header(header: str) -> tuple[int, list[str]]:
    timestamp, candidates = None, []
    for item in header.split(","):
        key, _, value = item.strip().partition("=")
        # Unix seconds: hundreds of digits would overflow the float of the age check.
        if key == "t" and value.isascii() and value.isdigit() and len(value) <= 12:
            timestamp = int(value)
        elif key == "v1":
            candidates.append(value.strip().lower())
    if timestamp is None or not candidates:
        raise CallbackSignatureInvalid(f"the {SIGNATURE_HEADER} header has no t= or no v1=")
    return timestamp, candidates


class Gateway:
    name = "gateway"
    off_session = True
    callbacks = True

    def __init__(self, base_url: str, secret_key: str, webhook_secret: str, return_url: str,
                 timeout: float) -> None:
        self._base_url = base_url
        self._secret_key = secret_key
        self._webhook_secret = webhook_secret
        self._return_url = return_url
        self._timeout = timeout

    def __repr__(self) -> str:  # the keys must never reach a log line
        return f"Gateway({self._base_url!r})"

    def _headers(self, idempotency_key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._secret_key}",
                "Idempotency-Key": idempotency_key}

    async def checkout(self, order: Order) -> Opened:
        form = {
            "mode": "payment",
            "success_url": f"{self._return_url}?subscription={order.subscription_id}",
            "cancel_url": f"{self._return_url}?subscription={order.subscription_id}&canceled=1",
            "client_reference_id": str(order.invoice_id),
            "customer_creation": "always",
            "payment_intent_data[setup_future_usage]": "off_session",
            "line_items[0][quantity]": "1",
            "line_items[0][price_data][currency]": "usd",
            "line_items[0][price_data][unit_amount]": str(order.amount_micro // MICRO_PER_CENT),
            "line_items[0][price_data][product_data][name]": f"FLOW {order.tier}",
            "metadata[invoice_id]": str(order.invoice_id),
            "metadata[subscription_id]": str(order.subscription_id),
            "expires_at": str(int(time.time()) + order.lifetime_seconds),
        }
        response = await send(self.name, "POST", f"{self._base_url}/v1/checkout/sessions",
                              self._timeout, data=form,
                              headers=self._headers(f"flowsvc-checkout-{order.invoice_id}"))
        session = answer_json(self.name, response)
        if response.status_code >= 300 or not isinstance(session.get("url"), str) \
                or not isinstance(session.get("id"), str):
            raise Unavailable(f"{self.name} refused to open a checkout session "
                              f"(HTTP {response.status_code})")
        return Opened(reference=session["id"], url=session["url"])

    def verify_callback(self, headers: Mapping[str, str], body: bytes, now: float
                        ) -> Confirmation:
        timestamp, candidates = _parse_header(headers.get(SIGNATURE_HEADER, ""))
        expected = signature(self._webhook_secret, timestamp, body).encode()
        if not any(hmac.compare_digest(expected, candidate.encode())
                   for candidate in candidates):
            raise CallbackSignatureInvalid(f"no v1 of the {SIGNATURE_HEADER} header matches")
        if abs(now - timestamp) > TOLERANCE_SECONDS:
            raise CallbackStale(f"the {SIGNATURE_HEADER} timestamp is more than "
                                f"{TOLERANCE_SECONDS} s from now")
        event = read_callback(self.name, _Event, callback_json(body))
        session = event.data.object
        paid = event.type == PAID_EVENTS[1] or (
            event.type == PAID_EVENTS[0] and session.get("payment_status") == "paid")
        if not paid:
            return Confirmation(event.id, None)
        paid_session = read_callback(self.name, _PaidSession, session, "data.object")
        if paid_session.currency != "usd":
            raise InvalidRequest(f"the {self.name} session is not in USD",
                                 details=[{"field": "data.object.currency",
                                           "message": "not usd"}])
        return Confirmation(event.id, Payment(
            provider=self.name, reference=paid_session.id,
            invoice_id=our_invoice_id(paid_session.client_reference_id),
            amount_micro=paid_session.amount_total * MICRO_PER_CENT,
            customer_ref=paid_session.customer, checkout_ref=paid_session.id))

    async def charge(self, order: Order, customer_ref: str) -> Payment:
        form = {"amount": str(order.amount_micro // MICRO_PER_CENT), "currency": "usd",
                "customer": customer_ref, "off_session": "true", "confirm": "true",
                "metadata[invoice_id]": str(order.invoice_id)}
        response = await send(self.name, "POST", f"{self._base_url}/v1/payment_intents",
                              self._timeout, data=form,
                              headers=self._headers(f"flowsvc-invoice-{order.invoice_id}"))
        intent = answer_json(self.name, response)
        if response.status_code >= 400 or intent.get("status") != "succeeded":
            error = intent.get("error")
            reason = error.get("decline_code") or error.get("code") \
                if isinstance(error, dict) else intent.get("status")
            raise ChargeDeclined(f"{self.name} declined the charge ({reason or 'no reason'})")
        return Payment(provider=self.name, reference=str(intent.get("id")),
                       invoice_id=order.invoice_id, amount_micro=order.amount_micro,
                       customer_ref=customer_ref)
