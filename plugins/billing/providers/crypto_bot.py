"""``crypto_bot``: a crypto-payment chat bot in the style of the Crypto Pay API.

Checkout is ``createInvoice`` (the app token in the ``Crypto-Pay-API-Token`` header) for an
amount in USD, with ``payload`` carrying our invoice and subscription ids
(``"<invoice>:<subscription>"``) and ``expires_in``; the invoice's pay URL is the
``checkoutUrl``. Payment arrives as a webhook update ``{update_id, update_type:
"invoice_paid", request_date, payload: <invoice>}`` signed in the header
``crypto-pay-api-signature``: the hex HMAC-SHA256 of the raw body, keyed with the SHA-256
digest of the app token. Nothing in it is timestamped, so replays are caught by the
update id (``billing_callbacks``) and a second payment of the same invoice by the invoice id
(``billing_payments``). A paid invoice settles only our invoice its ``payload`` names if
that invoice was opened as this very bot invoice, at ``amount`` exactly (a decimal string,
read without rounding). Nothing can be charged off-session: renewals are new invoices.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Any

from pydantic import Field

from plugins.billing.errors import CallbackSignatureInvalid
from plugins.billing.providers import (
    MAX_AMOUNT_MICRO,
    CallbackModel,
    ChargeDeclined,
    Confirmation,
    Opened,
    Order,
    Payment,
    answer_json,
    callback_json,
    our_invoice_id,
    read_callback,
    send,
)
from plugins.billing.tiers import format_usd
from runtime.errors import InvalidRequest, Unavailable
from runtime.inputs import MAX_ID
from runtime.wire import parse_flow

SIGNATURE_HEADER = "crypto-pay-api-signature"
TOKEN_HEADER = "Crypto-Pay-API-Token"  # noqa: S105 (a header name)
MAX_EXPIRES_IN = 2_678_400  # the API's limit: 31 days


class _Update(CallbackModel):
    update_id: int = Field(ge=0, le=MAX_ID)
    update_type: str
    payload: Any


class _PaidInvoice(CallbackModel):
    """An invoice of an ``invoice_paid`` update; ``amount`` is a decimal string of USD."""

    invoice_id: int = Field(ge=0, le=MAX_ID)
    status: str
    amount: str
    fiat: str = "USD"
    payload: str = ""


def signature(token: str, body: bytes) -> str:
    """The hex signature of a webhook ``body`` for the app ``token``."""
    key = hashlib.sha256(token.encode()).digest()
    return hmac.new(key, body, hashlib.sha256).hexdigest()


class CryptoBot:
    name = "crypto_bot"
    off_session = False
    callbacks = True

    def __init__(self, base_url: str, token: str, accepted_assets: str, timeout: float) -> None:
        self._base_url = base_url
        self._token = token
        self._assets = accepted_assets
        self._timeout = timeout

    def __repr__(self) -> str:  # the token must never reach a log line
        return f"CryptoBot({self._base_url!r})"

    async def checkout(self, order: Order) -> Opened:
        body: dict[str, Any] = {
            "currency_type": "fiat", "fiat": "USD",
            "amount": format_usd(order.amount_micro),
            "description": f"FLOW {order.tier} subscription ({order.purpose})",
            "payload": f"{order.invoice_id}:{order.subscription_id}",
            "expires_in": max(1, min(order.lifetime_seconds, MAX_EXPIRES_IN))}
        if self._assets:
            body["accepted_assets"] = self._assets
        response = await send(self.name, "POST", f"{self._base_url}/api/createInvoice",
                              self._timeout, json=body, headers={TOKEN_HEADER: self._token})
        answer = answer_json(self.name, response)
        result = answer.get("result")
        if not answer.get("ok") or not isinstance(result, dict):
            error = answer.get("error")
            name = error.get("name") if isinstance(error, dict) else None
            raise Unavailable(f"{self.name} refused createInvoice ({name or 'no reason'})")
        url = result.get("bot_invoice_url") or result.get("pay_url")
        if not isinstance(url, str) or "invoice_id" not in result:
            raise Unavailable(f"{self.name} answered createInvoice without a pay URL")
        return Opened(reference=str(result["invoice_id"]), url=url)

    def verify_callback(self, headers: Mapping[str, str], body: bytes, now: float
                        ) -> Confirmation:
        received = headers.get(SIGNATURE_HEADER, "").strip().lower()
        if not received:
            raise CallbackSignatureInvalid(f"the {SIGNATURE_HEADER} header is missing")
        if not hmac.compare_digest(signature(self._token, body).encode(), received.encode()):
            raise CallbackSignatureInvalid(f"the {SIGNATURE_HEADER} header does not match")
        update = read_callback(self.name, _Update, callback_json(body))
        if update.update_type != "invoice_paid":
            return Confirmation(str(update.update_id), None)
        invoice = read_callback(self.name, _PaidInvoice, update.payload, "payload")
        if invoice.status != "paid" or invoice.fiat != "USD":
            return Confirmation(str(update.update_id), None)
        amount_micro = parse_flow(invoice.amount, "payload.amount")
        if amount_micro > MAX_AMOUNT_MICRO:
            raise InvalidRequest(f"the {self.name} amount is beyond any invoice of ours",
                                 details=[{"field": "payload.amount", "message": "too large"}])
        reference = str(invoice.invoice_id)
        return Confirmation(str(update.update_id), Payment(
            provider=self.name, reference=reference,
            invoice_id=our_invoice_id(invoice.payload.split(":")[0]),
            amount_micro=amount_micro, checkout_ref=reference))

    async def charge(self, order: Order, customer_ref: str) -> Payment:
        raise ChargeDeclined(f"{self.name} cannot charge off-session")

