"""A fake payment gateway in Stripe's formats (Checkout sessions, off-session payment
intents, signed events), on a loopback port.

Requests are form-encoded with the secret key as a bearer token and honour
``Idempotency-Key`` (the same key answers the same response, and charges once). ``complete``
pays a session and sends ``checkout.session.completed`` to the service, signed as Stripe
documents: ``Stripe-Signature: t=<unix>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">``.
Customers in ``declining`` have their off-session charges declined (402, ``card_error``).
``requests`` lists every authenticated request (path, idempotency key), replays included.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
from quart import Response, request
from quart_trio import QuartTrio

from tests.support.fake_provider import deliver

SECRET_KEY = "sk_test_fakeGatewaySecretKey"
WEBHOOK_SECRET = "whsec_fakeGatewayWebhookSecret"


@dataclass
class FakeGateway:
    secret_key: str = SECRET_KEY
    webhook_secret: str = WEBHOOK_SECRET
    base_url: str = ""
    webhook_url: str = ""
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)
    charges: list[dict[str, Any]] = field(default_factory=list)
    declining: set[str] = field(default_factory=set)
    requests: list[tuple[str, str | None]] = field(default_factory=list)
    _replies: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def app(self) -> QuartTrio:
        app = QuartTrio("fake_gateway")

        @app.post("/v1/checkout/sessions")
        async def create_session() -> Response:
            return await self._idempotent(self._create_session)

        @app.post("/v1/payment_intents")
        async def create_intent() -> Response:
            return await self._idempotent(self._charge)

        return app

    async def _idempotent(self, make: Any) -> Response:
        if request.headers.get("Authorization") != f"Bearer {self.secret_key}":
            return _json(401, {"error": {"type": "invalid_request_error",
                                         "message": "Invalid API Key provided"}})
        key = request.headers.get("Idempotency-Key")
        self.requests.append((request.path, key))
        if key is None or key not in self._replies:
            reply = make(dict(await request.form))
            if key is None:
                return _json(*reply)
            self._replies[key] = reply
        return _json(*self._replies[key])

    def _create_session(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        session_id = f"cs_test_{secrets.token_hex(12)}"
        self.sessions[session_id] = {
            "id": session_id, "object": "checkout.session", "mode": form["mode"],
            "url": f"{self.base_url}/c/pay/{session_id}", "status": "open",
            "payment_status": "unpaid", "currency": form["line_items[0][price_data][currency]"],
            "amount_total": int(form["line_items[0][price_data][unit_amount]"]),
            "client_reference_id": form.get("client_reference_id"),
            "metadata": {key[9:-1]: value for key, value in form.items()
                         if key.startswith("metadata[")},
            "expires_at": int(form["expires_at"]), "customer": None}
        return 200, self.sessions[session_id]

    def _charge(self, form: dict[str, str]) -> tuple[int, dict[str, Any]]:
        intent_id = f"pi_{secrets.token_hex(12)}"
        customer = form["customer"]
        self.charges.append({"id": intent_id, **form})
        if customer in self.declining:
            return 402, {"error": {"type": "card_error", "code": "card_declined",
                                   "decline_code": "insufficient_funds",
                                   "payment_intent": {"id": intent_id,
                                                      "status": "requires_payment_method"}}}
        return 200, {"id": intent_id, "object": "payment_intent", "status": "succeeded",
                     "amount": int(form["amount"]), "currency": form["currency"],
                     "customer": customer}

    def signed_event(self, session_id: str, *, event_type: str = "checkout.session.completed",
                     timestamp: int | None = None, secret: str | None = None,
                     customer: str | None = None) -> tuple[bytes, dict[str, str]]:
        """A paid session's event and its ``Stripe-Signature`` header (an old ``timestamp``
        or another ``secret`` make a stale or forged one)."""
        session = self.sessions[session_id]
        session.update(status="complete", payment_status="paid",
                       customer=session["customer"] or customer or f"cus_{secrets.token_hex(6)}")
        event = {"id": f"evt_{secrets.token_hex(12)}", "object": "event", "type": event_type,
                 "created": int(time.time()), "data": {"object": session}}
        body = json.dumps(event).encode()
        return body, self.sign(body, timestamp=timestamp, secret=secret)

    def sign(self, body: bytes, *, timestamp: int | None = None, secret: str | None = None
             ) -> dict[str, str]:
        """The ``Stripe-Signature`` header of any ``body`` (hostile ones, correctly signed)."""
        moment = int(time.time()) if timestamp is None else timestamp
        v1 = hmac.new((secret or self.webhook_secret).encode(), f"{moment}.".encode() + body,
                      hashlib.sha256).hexdigest()
        return {"stripe-signature": f"t={moment},v1={v1}"}

    async def complete(self, session_id: str, *, customer: str | None = None
                       ) -> httpx.Response:
        """The payer pays the session: the event goes to the service's callback."""
        body, headers = self.signed_event(session_id, customer=customer)
        return await deliver(self.webhook_url, body, headers)

    def session_of_url(self, url: str) -> str:
        return url.rsplit("/", 1)[-1]


def _json(status: int, body: dict[str, Any]) -> Response:
    return Response(json.dumps(body), status=status, content_type="application/json")
