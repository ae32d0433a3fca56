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
A verified body is then read strictly (``callback_json``, ``read_callback``): the JSON
limits of every request body, each field of the type the provider documents (an amount of
cents is an integer, never ``2000.9``), amounts at most ``MAX_AMOUNT_MICRO``; anything else
is a 400 ``invalid_request`` that changes nothing.
A provider is built only when its settings are complete (``configured``); the others are
not enabled. An unreachable provider (network error, timeout, 5xx) raises ``Unavailable``,
which callers treat as an outage to wait out, never as a declined payment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Annotated, Any, Protocol, TypeVar

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runtime.errors import InvalidRequest, Unavailable
from runtime.inputs import MAX_ID, parse_json_body

log = logging.getLogger("flowsvc.billing.providers")
MAX_AMOUNT_MICRO = 10**15
"""The largest amount a callback may state: 10^9 USD, far above any price and far below
the 2^63 of the amount columns."""
Reference = Annotated[str, Field(min_length=1, max_length=255)]
"""A provider's id of an event, a payment or a customer, as its columns hold it."""
Model = TypeVar("Model", bound="CallbackModel")


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
    :param checkout_ref: a callback's: the provider's id of the checkout it was paid through
        (``Opened.reference``); it settles only the invoice that was opened as that
        checkout. None where we chose the invoice ourselves (an off-session charge, a
        transfer recognised by its amount).
    """

    provider: str
    reference: str
    invoice_id: int | None
    amount_micro: int
    paid_at: datetime | None = None
    token_amount: str | None = None
    sender: str | None = None
    customer_ref: str | None = None
    checkout_ref: str | None = None


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


class CallbackModel(BaseModel):
    """A part of a provider's callback, read strictly: a field of another JSON type than the
    provider documents is refused, not converted. Fields it adds later are ignored."""

    model_config = ConfigDict(strict=True)


def callback_json(body: bytes) -> Any:
    """The JSON of a verified callback body, fractions as ``Decimal``.

    :raises InvalidRequest: not UTF-8 JSON within the limits of any request body (nesting,
        NaN or Infinity, NUL characters).
    """
    return parse_json_body(body, parse_float=Decimal)


def read_callback(name: str, model: type[Model], value: Any, at: str = "") -> Model:
    """``value``, found at ``at`` in the callback (``data.object``), read as ``model``.

    :raises InvalidRequest: it is not what provider ``name`` sends (details name the fields).
    """
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        where = [at] if at else []
        details = [{"field": ".".join([*where, *(str(part) for part in error["loc"])]) or "body",
                    "message": error["msg"]} for error in exc.errors()[:10]]
        raise InvalidRequest(f"the {name} callback is not one it sends",
                             details=details) from None


def our_invoice_id(text: str | None) -> int | None:
    """The invoice id a provider was given at checkout, read back from its callback: ASCII
    digits from 1 to 2^63 - 1, else None (it names no invoice of ours)."""
    if text is None or not (text.isascii() and text.isdigit()) or len(text) > 19:
        return None
    number = int(text)
    return number if 0 < number <= MAX_ID else None
