"""Settling a verified payment: record it, and grant what it paid for at most once.

``settle`` runs inside one transaction (a callback's, the scheduler's, or the chain
indexer's). It records the payment under its provider reference, unique in
``billing_payments``: the same confirmation delivered twice finds the row already there and
changes nothing (an insert that fails, not a check-then-insert). A payment is matched to the
invoice it names only if that invoice went to the same provider and, for a callback's, was
opened as the checkout the callback names (``Payment.checkout_ref`` equals the invoice's
``provider_ref``). It grants only when it pays an open, unexpired invoice exactly;
otherwise it is recorded with the reason and reported, never silently granted:

| outcome | when |
|---|---|
| ``granted`` | it paid an open invoice exactly: the subscription activates, renews or upgrades |
| ``duplicate`` | its invoice was already paid |
| ``late`` | its invoice had expired or was void, or the period it paid for is over |
| ``short`` / ``over`` | less or more than the invoice asked |
| ``unmatched`` | it names no invoice of ours, or one of another provider or checkout |
| ``conflict`` | a checkout paid while the user already had a live subscription |

Every payment that belongs to a user emits ``payment.received`` with its outcome; a grant
also emits ``subscription.granted``, both in the same transaction as the change.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.billing import invoices, subscriptions
from plugins.billing.events import NO_FLOW, emit
from plugins.billing.invoices import Invoice
from plugins.billing.providers import Payment
from plugins.billing.state import BILLING, BillingState
from plugins.billing.subscriptions import ACTIVE, GRACE, PENDING, Subscription
from plugins.billing.tables import payments
from plugins.billing.tiers import format_usd, rank
from runtime.service import Service
from runtime.wire import as_utc, iso

REPEATED = "repeated"


def _invoice_of(connection: Connection, payment: Payment) -> Invoice | None:
    """The invoice ``payment`` pays, locked: the one it names, if that invoice went to the
    same provider and was opened as the same checkout (a signed callback can still name an
    invoice of another provider, or a session the service never issued)."""
    if payment.invoice_id is None:
        return None
    invoice = invoices.get(connection, payment.invoice_id, lock=True)
    if invoice is None or invoice.provider != payment.provider \
            or invoice.provider_ref != payment.checkout_ref:
        return None
    return invoice


def _judge(invoice: Invoice | None, payment: Payment, paid_at: datetime) -> str | None:
    """Why the payment cannot grant, or None when it pays its invoice exactly."""
    if invoice is None:
        return "unmatched"
    asked = invoice.token_amount if invoice.token_amount is not None else invoice.amount_micro
    paid = int(payment.token_amount) if invoice.token_amount is not None \
        and payment.token_amount is not None else payment.amount_micro
    if paid != asked:
        return "short" if paid < asked else "over"
    if invoice.status == invoices.PAID:
        return "duplicate"
    if invoice.status != invoices.OPEN or paid_at > invoice.expires_at:
        return "late"
    return None


def settle(service: Service, connection: Connection, payment: Payment, *,
           user_id: int | None = None) -> str:
    """Record ``payment`` and grant what it pays for; its outcome (``REPEATED`` when this
    very confirmation was recorded before: nothing is written then).

    :param user_id: whom a payment without an invoice belongs to, when known.
    """
    state = service.state(BILLING)
    now = state.clock.now()
    invoice = _invoice_of(connection, payment)
    owner = invoice.user_id if invoice is not None else user_id
    outcome = _judge(invoice, payment, as_utc(payment.paid_at) if payment.paid_at else now)
    try:
        with connection.begin_nested():
            payment_id = connection.execute(insert(payments).values(
                provider=payment.provider, reference=payment.reference,
                invoice_id=invoice.id if invoice else None, user_id=owner,
                amount_micro=payment.amount_micro, token_amount=payment.token_amount,
                sender=payment.sender, outcome=outcome or "granted", received_at=now)
            ).inserted_primary_key[0]  # type: ignore[index]
    except IntegrityError:
        return REPEATED
    if outcome is None:
        assert invoice is not None
        outcome = _grant(service, connection, state, invoice, payment, now)
        connection.execute(update(payments).where(payments.c.id == payment_id)
                           .values(outcome=outcome))
    if owner is not None:
        data: dict[str, Any] = {"provider": payment.provider,
                                "amount_usd": format_usd(payment.amount_micro),
                                "amount_flow": NO_FLOW, "outcome": outcome,
                                "invoice_id": str(invoice.id) if invoice else None}
        service.emit_event(connection, user_id=owner, name="payment.received", data={
            **data, "subscription_id": str(invoice.subscription_id) if invoice else None})
    return outcome


def _grant(service: Service, connection: Connection, state: BillingState, invoice: Invoice,
           payment: Payment, now: datetime) -> str:
    subscription = subscriptions.get(connection, invoice.subscription_id, lock=True)
    assert subscription is not None
    values = _granted_values(state, subscription, invoice, payment, now)
    if values is None:
        return "late"
    if invoice.purpose == "checkout":
        subscriptions.live_with_tier(service, connection, subscription.user_id, now)
        try:
            with connection.begin_nested():
                subscriptions.change(connection, subscription, now,
                                     live_user_id=subscription.user_id, **values)
        except IntegrityError:
            return "conflict"
        invoices.void_open(connection, user_id=subscription.user_id, purpose="checkout")
    else:
        subscriptions.change(connection, subscription, now, **values)
    invoices.set_status(connection, invoice.id, invoices.PAID, now)
    renews_at = values.get("renews_at", subscription.renews_at)
    emit(service, connection, subscription.user_id, "subscription.granted", subscription.id,
         tier=invoice.tier, amount_flow=NO_FLOW, purpose=invoice.purpose,
         renews_at=iso(renews_at) if renews_at is not None else None)
    return "granted"


def _granted_values(state: BillingState, subscription: Subscription, invoice: Invoice,
                    payment: Payment, now: datetime) -> dict[str, Any] | None:
    """The subscription's new values once ``invoice`` is paid, or None when the invoice no
    longer fits it (the period it paid for is over, the tier changed)."""
    period = state.period
    if invoice.purpose == "checkout" and subscription.status == PENDING:
        renews_at = now + period
        return {"status": ACTIVE, "tier": invoice.tier, "period_start": now,
                "renews_at": renews_at, "retries": 0, "customer_ref": payment.customer_ref,
                "due_at": state.due_at(renews_at, subscription.provider)}
    if invoice.purpose == "renewal" and subscription.status in (ACTIVE, GRACE) \
            and subscription.renews_at is not None \
            and invoice.period_end == subscription.renews_at + period:
        return {"status": ACTIVE, "tier": invoice.tier, "next_tier": None,
                "period_start": subscription.renews_at, "renews_at": invoice.period_end,
                "retries": 0,
                "due_at": state.due_at(invoice.period_end, subscription.provider)}
    if invoice.purpose == "upgrade" and subscription.status == ACTIVE \
            and invoice.period_end == subscription.renews_at \
            and rank(invoice.tier) > rank(subscription.tier):
        return {"tier": invoice.tier, "next_tier": None}
    return None


def payment_list(connection: Connection, *, user_id: int | None = None,
                 outcome: str | None = None, before: int | None = None, limit: int = 20
                 ) -> list[dict[str, Any]]:
    """Recorded payments, newest first, in their public shape."""
    query = select(payments).order_by(payments.c.id.desc()).limit(limit)
    if user_id is not None:
        query = query.where(payments.c.user_id == user_id)
    if outcome is not None:
        query = query.where(payments.c.outcome == outcome)
    if before is not None:
        query = query.where(payments.c.id < before)
    return [{"paymentId": str(row.id), "provider": row.provider, "reference": row.reference,
             "invoiceId": str(row.invoice_id) if row.invoice_id else None,
             "userId": str(row.user_id) if row.user_id else None,
             "amountUsd": format_usd(row.amount_micro), "tokenAmount": row.token_amount,
             "sender": row.sender, "outcome": row.outcome,
             "receivedAt": iso(row.received_at)} for row in connection.execute(query)]
