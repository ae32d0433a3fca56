"""One step of the billing schedule for a subscription the scheduler claimed.

- active, ``renewal_notice_hours`` before ``renews_at``: invoice providers (``crypto_bot``,
  ``usdt_bep20``) send the renewal invoice, payable until ``renews_at``;
- active, at ``renews_at``: the off-session provider (``gateway``) charges the next period;
  for invoice providers the invoice is unpaid: grace, and a new invoice due in a day;
- grace, each day: charge again, or (invoices) the day's invoice is unpaid: a new one;
- grace, the 7th failed retry: canceled, tier ``none``;
- canceled, at ``ends_at``: ended, tier ``none``.

A payment (a charge here, a callback, a transfer) renews through ``payments.settle``: the
new period starts at the old ``renewsAt``, so days spent in grace count in it. Every
attempt has a key (``<subscription>:<renewsAt>:<attempt>``) naming its invoice, so an
attempt interrupted by a crash or an outage is repeated with the same invoice, and the
gateway gets that invoice as its ``Idempotency-Key``: a retried charge never charges twice.
An outage (``Unavailable``) propagates: the scheduler leaves the claim to expire and the
step is tried again later.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import Connection

from plugins.billing import invoices, payments, subscriptions
from plugins.billing.invoices import Invoice
from plugins.billing.providers import ChargeDeclined, Opened, Provider
from plugins.billing.state import BillingState
from plugins.billing.subscriptions import ACTIVE, CANCELED, GRACE, GRACE_RETRIES, Subscription
from plugins.billing.tiers import PRICE_MICRO, format_usd
from runtime.contracts.messenger import MESSENGER_ACTOR, MessageUser
from runtime.service import Service
from runtime.wire import iso

log = logging.getLogger("flowsvc.billing.renewals")


async def step(service: Service, state: BillingState, subscription: Subscription) -> None:
    """Do what is due for ``subscription`` (claimed at its current ``version``)."""
    now = state.clock.now()
    if subscription.status == CANCELED:
        await service.db.write(
            lambda connection: subscriptions.end(service, connection, subscription, now, "user"))
        return
    renews_at = subscription.renews_at
    assert renews_at is not None
    provider = state.providers.get(subscription.provider)
    if subscription.status == ACTIVE and now < renews_at:
        if provider is not None:
            await _send_invoice(service, state, subscription, provider, "notice", renews_at,
                                lambda c: subscriptions.change(c, subscription, now,
                                                               due_at=renews_at))
        return
    if provider is None:
        reason = "provider_disabled"
    elif provider.off_session:
        declined = await _charge(service, state, subscription, provider)
        if declined is None:
            return
        reason = declined
    else:
        reason = "invoice_unpaid"
    retries = 0 if subscription.status == ACTIVE else subscription.retries + 1

    def fail(connection: Connection) -> bool:
        return subscriptions.fail_renewal(service, connection, subscription, now, reason)

    if provider is None or provider.off_session or \
            (subscription.status == GRACE and retries >= GRACE_RETRIES):
        await service.db.write(fail)
        return
    deadline = renews_at + (retries + 1) * subscriptions.RETRY_EVERY
    await _send_invoice(service, state, subscription, provider, f"retry{retries}", deadline,
                        fail)


def _renewal_invoice(state: BillingState, subscription: Subscription, attempt: str,
                     expires: datetime) -> Callable[[Connection], Invoice]:
    assert subscription.renews_at is not None
    renews_at = subscription.renews_at
    tier = subscription.next_tier or subscription.tier
    now = state.clock.now()

    def create(connection: Connection) -> Invoice:
        return invoices.create(
            connection, subscription_id=subscription.id, user_id=subscription.user_id,
            purpose="renewal", tier=tier, provider=subscription.provider,
            amount_micro=PRICE_MICRO[tier], expires_at=expires,
            now=now, period_end=renews_at + state.period,
            attempt_key=f"{subscription.id}:{int(renews_at.timestamp())}:{attempt}",
            token_decimals=state.token_decimals(subscription.provider))

    return create


async def _send_invoice(service: Service, state: BillingState, subscription: Subscription,
                        provider: Provider, attempt: str, deadline: datetime,
                        transition: Callable[[Connection], bool]) -> None:
    """Open a renewal invoice with the provider, commit it with ``transition``, then send it
    to the user through the messenger (those with a messaging identity get it)."""
    invoice = await service.db.write(_renewal_invoice(state, subscription, attempt, deadline))
    opened = await provider.checkout(invoice.order(state.clock.now()))

    def commit(connection: Connection) -> bool:
        invoices.record_opened(connection, invoice.id, opened)
        if transition(connection):
            return True
        invoices.set_status(connection, invoice.id, invoices.VOID)  # the row moved on
        return False

    if await service.db.write(commit):
        notify(service, subscription.user_id, invoice, opened)


def notify(service: Service, user_id: int, invoice: Invoice, opened: Opened) -> None:
    """Send the user a renewal invoice through the bot; dropped without a messenger."""
    address = service.registry.get(MESSENGER_ACTOR)
    if address is None:
        return
    if opened.payment is not None:
        how = (f"send exactly {opened.payment['amount']} USDT (BEP-20) to "
               f"{opened.payment['address']}")
    else:
        how = f"pay {format_usd(invoice.amount_micro)} USD at {opened.url}"
    text = (f"Your FLOW {invoice.tier} subscription is due for renewal. To keep it, {how} "
            f"before {iso(invoice.expires_at)}.")
    if not address.try_cast(MessageUser(user_ids=(user_id,), text=text)):
        log.warning("renewal invoice %d not sent: the messenger's mailbox is full", invoice.id)


async def _charge(service: Service, state: BillingState, subscription: Subscription,
                  provider: Provider) -> str | None:
    """Charge the next period off-session; None once the payment is settled, else why it
    was declined (the invoice is marked failed)."""
    if subscription.customer_ref is None:
        return "no_payment_method"
    attempt = "charge0" if subscription.status == ACTIVE else \
        f"charge{subscription.retries + 1}"
    invoice = await service.db.write(_renewal_invoice(
        state, subscription, attempt, state.clock.now() + subscriptions.RETRY_EVERY))
    try:
        payment = await provider.charge(invoice.order(state.clock.now()),
                                        subscription.customer_ref)
    except ChargeDeclined as exc:
        await service.db.write(invoices.set_status, invoice.id, invoices.FAILED)
        log.info("renewal of subscription %d declined: %s", subscription.id, exc)
        return "payment_declined"
    outcome = await service.db.write(
        lambda connection: payments.settle(service, connection, payment))
    if outcome not in ("granted", payments.REPEATED):
        log.warning("renewal charge %s of subscription %d settled as %s",
                    payment.reference, subscription.id, outcome)
    return None
