"""Invoices: every payment billing asks for (a checkout, a renewal, an upgrade).

An invoice is ``open`` until it is ``paid``, ``void`` (superseded: the subscription was
canceled, or another checkout was paid) or ``failed`` (the provider could not open it or
declined the charge); an open invoice past ``expires_at`` is expired. ``period_end`` is the
end of the period it pays for (renewals, upgrades), so a payment that arrives after that
period changed grants nothing. A ``usdt_bep20`` invoice reserves an amount of its own
(``reserve_token_amount``) until ``usdt_quarantine_hours`` after it expires, so a late
transfer is still recognised as late rather than as someone else's payment.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.billing.providers import Opened, Order
from plugins.billing.tables import invoices
from plugins.billing.tiers import format_usd
from runtime.errors import Unavailable
from runtime.wire import as_utc, iso

OPEN, PAID, VOID, FAILED = "open", "paid", "void", "failed"
TOKEN_SUFFIX_LIMIT = 100_000  # unique suffixes stay below 0.1 USDT (micro-USDT)
_RESERVE_TRIES = 32


@dataclass(frozen=True)
class Invoice:
    id: int
    subscription_id: int
    user_id: int
    purpose: str
    tier: str
    provider: str
    amount_micro: int
    period_end: datetime | None
    token_amount: int | None
    provider_ref: str | None
    checkout_url: str | None
    status: str
    expires_at: datetime
    created_at: datetime
    paid_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> Invoice:
        return cls(id=int(row.id), subscription_id=int(row.subscription_id),
                   user_id=int(row.user_id), purpose=row.purpose, tier=row.tier,
                   provider=row.provider, amount_micro=int(row.amount_micro),
                   period_end=as_utc(row.period_end) if row.period_end else None,
                   token_amount=int(row.token_amount) if row.token_amount else None,
                   provider_ref=row.provider_ref, checkout_url=row.checkout_url,
                   status=row.status, expires_at=as_utc(row.expires_at),
                   created_at=as_utc(row.created_at),
                   paid_at=as_utc(row.paid_at) if row.paid_at else None)

    def order(self, now: datetime) -> Order:
        """What the provider is asked to collect."""
        return Order(invoice_id=self.id, subscription_id=self.subscription_id,
                     user_id=self.user_id, tier=self.tier, purpose=self.purpose,
                     amount_micro=self.amount_micro, expires_at=self.expires_at,
                     lifetime_seconds=max(1, int((self.expires_at - now).total_seconds())),
                     token_amount=self.token_amount)

    def public(self, payment: dict[str, Any] | None = None) -> dict[str, Any]:
        return {"invoiceId": str(self.id), "purpose": self.purpose, "tier": self.tier,
                "provider": self.provider, "amountUsd": format_usd(self.amount_micro),
                "status": self.status, "checkoutUrl": self.checkout_url,
                "expiresAt": iso(self.expires_at), "payment": payment}


def get(connection: Connection, invoice_id: int, *, lock: bool = False) -> Invoice | None:
    query = select(invoices).where(invoices.c.id == invoice_id)
    row = connection.execute(query.with_for_update() if lock else query).first()
    return Invoice.of(row) if row else None


def create(connection: Connection, *, subscription_id: int, user_id: int, purpose: str,
           tier: str, provider: str, amount_micro: int, expires_at: datetime, now: datetime,
           period_end: datetime | None = None, attempt_key: str | None = None,
           token_decimals: int | None = None) -> Invoice:
    """An open invoice; with ``attempt_key``, the one already made for that attempt if any.

    :param token_decimals: for ``usdt_bep20``: reserve a unique amount in base units.
    :raises Unavailable: no free token amount was found (practically never).
    """
    if attempt_key is not None:
        row = connection.execute(select(invoices).where(invoices.c.attempt_key == attempt_key)
                                 ).first()
        if row is not None:
            return Invoice.of(row)
    invoice_id = int(connection.execute(insert(invoices).values(
        subscription_id=subscription_id, user_id=user_id, purpose=purpose, tier=tier,
        provider=provider, amount_micro=amount_micro, period_end=period_end,
        attempt_key=attempt_key, status=OPEN, expires_at=expires_at, created_at=now)
    ).inserted_primary_key[0])  # type: ignore[index]
    if token_decimals is not None:
        reserve_token_amount(connection, invoice_id, amount_micro, token_decimals)
    invoice = get(connection, invoice_id)
    assert invoice is not None
    return invoice


def reserve_token_amount(connection: Connection, invoice_id: int, amount_micro: int,
                         decimals: int) -> int:
    """Give the invoice ``amount_micro`` plus a random suffix below 0.1 USDT, as base units
    no other reserved invoice has (the unique ``token_reserved`` decides, not a check)."""
    scale = 10 ** (decimals - 6)
    for _ in range(_RESERVE_TRIES):
        amount = (amount_micro + 1 + secrets.randbelow(TOKEN_SUFFIX_LIMIT - 1)) * scale
        try:
            with connection.begin_nested():
                connection.execute(update(invoices).where(invoices.c.id == invoice_id).values(
                    token_amount=str(amount), token_reserved=str(amount)))
        except IntegrityError:
            continue
        return int(amount)
    raise Unavailable("no free USDT amount for a new invoice; try again")


def by_reserved_amount(connection: Connection, amount: int) -> Invoice | None:
    """The invoice that reserved exactly ``amount`` base units, if any."""
    row = connection.execute(select(invoices).where(invoices.c.token_reserved == str(amount))
                             .with_for_update()).first()
    return Invoice.of(row) if row else None


def latest_of(connection: Connection, user_id: int, provider: str) -> Invoice | None:
    """The user's newest invoice through ``provider`` (to attribute a payment that matches
    no invoice exactly)."""
    row = connection.execute(select(invoices).where(invoices.c.user_id == user_id)
                             .where(invoices.c.provider == provider)
                             .order_by(invoices.c.id.desc()).limit(1)).first()
    return Invoice.of(row) if row else None


def open_of(connection: Connection, subscription_id: int, now: datetime) -> Invoice | None:
    """The newest open, unexpired invoice of a subscription that the payer can still pay."""
    row = connection.execute(
        select(invoices).where(invoices.c.subscription_id == subscription_id)
        .where(invoices.c.status == OPEN).where(invoices.c.expires_at > now)
        .where(invoices.c.checkout_url.is_not(None))
        .order_by(invoices.c.id.desc()).limit(1)).first()
    return Invoice.of(row) if row else None


def record_opened(connection: Connection, invoice_id: int, opened: Opened) -> None:
    connection.execute(update(invoices).where(invoices.c.id == invoice_id).values(
        provider_ref=opened.reference, checkout_url=opened.url))


def set_status(connection: Connection, invoice_id: int, status: str,
               paid_at: datetime | None = None) -> None:
    connection.execute(update(invoices).where(invoices.c.id == invoice_id)
                       .values(status=status, paid_at=paid_at))


def void_open(connection: Connection, *, subscription_id: int | None = None,
              user_id: int | None = None, purpose: str | None = None) -> None:
    """Void the open invoices of a subscription, or of a user for one purpose."""
    query = update(invoices).where(invoices.c.status == OPEN)
    if subscription_id is not None:
        query = query.where(invoices.c.subscription_id == subscription_id)
    if user_id is not None:
        query = query.where(invoices.c.user_id == user_id)
    if purpose is not None:
        query = query.where(invoices.c.purpose == purpose)
    connection.execute(query.values(status=VOID))


def release_reservations(connection: Connection, expired_before: datetime) -> int:
    """Free the token amounts of invoices that expired before ``expired_before``."""
    return int(connection.execute(
        update(invoices).where(invoices.c.token_reserved.is_not(None))
        .where(invoices.c.expires_at < expired_before).values(token_reserved=None)).rowcount)
