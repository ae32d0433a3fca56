"""Payment providers: one interface, one module per provider.

- ``crypto_bot``: a crypto-payment chat bot in the style of the Crypto Pay API; renewals are
  new invoices sent to the user.
- ``gateway``: a payment gateway in the style of Stripe Checkout; renewals are charged
  off-session.
- ``usdt_bep20``: a USDT transfer on BSC, seen by the chain plugin's indexer; renewals are
  new invoices sent to the user.

A provider turns one of our invoices (an ``Order``) into something the payer can pay
(``checkout``), proves that a callback really comes from it (``verify_callback``: the raw
body is verified before it is parsed, secrets are compared in constant time and never
logged), and, when it can, charges a saved payment method without the user (``charge``).
A provider is built only when its settings are complete (``configured``); the others are
not enabled. An unreachable provider (network error, timeout, 5xx) raises ``Unavailable``,
which callers treat as an outage to wait out, never as a declined payment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import httpx

from runtime.errors import Unavailable

log = logging.getLogger("flowsvc.billing.providers")


@dataclass(frozen=True)
class Order:
    """One of our invoices, as a provider needs it.

    :param amount_micro: what to collect, in micro-USD (whole cents for card providers).
    :param lifetime_seconds: how long the payment may take (to ``expires_at`` on the billing
        clock; providers count it from the real time).
    :param token_amount: ``usdt_bep20`` only: the exact amount in the token's base units.
    """

    invoice_id: int
    subscription_id: int
    user_id: int
    tier: str
    purpose: str
    amount_micro: int
    expires_at: datetime
    lifetime_seconds: int
    token_amount: int | None = None


@dataclass(frozen=True)
class Opened:
    """What the payer is sent to: ``url`` (the ``checkoutUrl``), the provider's own id of
    the invoice or session, and, for ``usdt_bep20``, the transfer to make."""

    reference: str | None
    url: str
    payment: dict[str, Any] | None = None


@dataclass(frozen=True)
class Payment:
    """Money a provider says it received, once its confirmation was verified.

    :param reference: the provider's id of the payment, unique per provider (an invoice
        id, a checkout session, a payment intent, ``chain:tx:log``): it grants once.
    :param invoice_id: our invoice it claims to pay, when the confirmation names one.
    :param amount_micro: micro-USD received (USDT counts 1:1, rounded down to 10^-6).
    :param paid_at: when it was paid, on chain the block's time; None: when the confirmation
        arrived, on the billing clock (what invoice expiries are judged by).
    :param customer_ref: the gateway's customer, kept for off-session renewals.
    """

    provider: str
    reference: str
    invoice_id: int | None
    amount_micro: int
    paid_at: datetime | None = None
    token_amount: str | None = None
    sender: str | None = None
    customer_ref: str | None = None


@dataclass(frozen=True)
class Confirmation:
    """A verified callback: its event id (replays are refused on it) and the payment it
    confirms, None for an event that confirms no payment (acknowledged, ignored)."""

    event_id: str
    payment: Payment | None


class ChargeDeclined(Exception):
    """Raised by ``charge`` when the provider refuses the payment (a declined card)."""


class Provider(Protocol):
    name: str
    off_session: bool
    """Whether renewals are charged without the user (else a renewal invoice is sent)."""
    callbacks: bool
    """Whether payments are confirmed by signed HTTP callbacks (``/billing/webhooks/<name>``)."""

    async def checkout(self, order: Order) -> Opened:
        """Open a payment of ``order`` for the payer.

        :raises Unavailable: the provider cannot be reached or refused the request.
        """
        ...

    def verify_callback(self, headers: Mapping[str, str], body: bytes, now: float
                        ) -> Confirmation:
        """Verify a callback's signature over its raw body, then read it.

        :param headers: the request's headers, names in lowercase.
        :param now: the real time, Unix seconds (for signature timestamps).
        :raises CallbackSignatureInvalid: no or a wrong signature.
        :raises CallbackStale: a signed timestamp too far from ``now``.
        :raises InvalidRequest: a well-signed body that is not what the provider sends.
        """
        ...

    async def charge(self, order: Order, customer_ref: str) -> Payment:
        """Charge ``order`` to the customer's saved payment method, off-session.

        :raises ChargeDeclined: the payment was refused.
        :raises Unavailable: the provider cannot be reached.
        """
        ...


async def send(name: str, method: str, url: str, timeout: float, **kwargs: Any
               ) -> httpx.Response:
    """One request to provider ``name``; network errors and 5xx answers are outages.

    :raises Unavailable: no answer, a timeout or a 5xx.
    """
    try:
        async with httpx.AsyncClient(timeout=timeout) as http:
            response = await http.request(method, url, **kwargs)
    except httpx.HTTPError as exc:
        log.warning("%s unreachable: %s", name, type(exc).__name__)
        raise Unavailable(f"the payment provider {name} cannot be reached") from None
    if response.status_code >= 500:
        log.warning("%s answered HTTP %s", name, response.status_code)
        raise Unavailable(f"the payment provider {name} is unavailable")
    return response


def answer_json(name: str, response: httpx.Response) -> dict[str, Any]:
    """The JSON object of a provider's answer.

    :raises Unavailable: the answer is not a JSON object.
    """
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise Unavailable(f"the payment provider {name} sent an answer that is not JSON")
    return body
