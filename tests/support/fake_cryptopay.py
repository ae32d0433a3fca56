"""A fake crypto-payment bot in the Crypto Pay API's formats, on a loopback port.

``createInvoice`` takes the app token in the ``Crypto-Pay-API-Token`` header and answers
``{ok, result: invoice}``; ``pay`` marks an invoice paid and sends the ``invoice_paid``
update to the service, signed as the API documents: ``crypto-pay-api-signature`` = hex
HMAC-SHA256 of the raw body keyed with the SHA-256 digest of the app token.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import secrets
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import httpx
from quart import Response, request
from quart_trio import QuartTrio

from tests.support.fake_provider import deliver

TOKEN = "12345:AAfakeCryptoPayAppTokenForTests"


@dataclass
class FakeCryptoPay:
    token: str = TOKEN
    base_url: str = ""
    webhook_url: str = ""
    invoices: dict[int, dict[str, Any]] = field(default_factory=dict)
    created: list[dict[str, Any]] = field(default_factory=list)
    fail_next: int = 0
    _ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1001))
    _updates: itertools.count[int] = field(default_factory=lambda: itertools.count(5001))

    def app(self) -> QuartTrio:
        app = QuartTrio("fake_cryptopay")

        @app.post("/api/createInvoice")
        async def create_invoice() -> Response:
            if self.fail_next:
                self.fail_next -= 1
                return Response("unavailable", status=503)
            if request.headers.get("Crypto-Pay-API-Token") != self.token:
                return _json({"ok": False, "error": {"code": 401, "name": "UNAUTHORIZED"}}, 401)
            body = await request.get_json()
            self.created.append(body)
            invoice_id = next(self._ids)
            invoice_hash = secrets.token_hex(8)
            self.invoices[invoice_id] = {
                "invoice_id": invoice_id, "hash": invoice_hash, "currency_type": "fiat",
                "fiat": body["fiat"], "amount": body["amount"], "status": "active",
                "description": body.get("description"), "payload": body.get("payload"),
                "bot_invoice_url": f"https://t.me/CryptoBot?start={invoice_hash}",
                "created_at": _now()}
            return _json({"ok": True, "result": self.invoices[invoice_id]})

        return app

    def signed_update(self, invoice_id: int, *, update_id: int | None = None
                      ) -> tuple[bytes, dict[str, str]]:
        """The ``invoice_paid`` update of ``invoice_id`` and its signature header."""
        invoice = self.invoices[invoice_id]
        invoice.update(status="paid", paid_at=invoice.get("paid_at") or _now(),
                       paid_asset="USDT", paid_amount=invoice["amount"])
        update = {"update_id": update_id or next(self._updates), "update_type": "invoice_paid",
                  "request_date": _now(), "payload": invoice}
        body = json.dumps(update).encode()
        return body, self.sign(body)

    def sign(self, body: bytes) -> dict[str, str]:
        """The signature header of any ``body`` (hostile ones, correctly signed)."""
        key = hashlib.sha256(self.token.encode()).digest()
        return {"crypto-pay-api-signature": hmac.new(key, body, hashlib.sha256).hexdigest()}

    async def pay(self, invoice_id: int) -> httpx.Response:
        """The payer pays: the update goes to the service's callback."""
        body, headers = self.signed_update(invoice_id)
        return await deliver(self.webhook_url, body, headers)

    def invoice_of_url(self, url: str) -> int:
        """The invoice whose pay URL the service answered as ``checkoutUrl``."""
        return next(invoice_id for invoice_id, invoice in self.invoices.items()
                    if invoice["bot_invoice_url"] == url)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _json(body: dict[str, Any], status: int = 200) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")
