"""Routes of the billing plugin: checkout, the caller's subscription, its changes and
payments, and the internal clock and payment list (docs/billing.md).

Views are module-level functions on ``blueprint``; they find the service with
``current_service()`` and the plugin's state with ``service.state(BILLING)``.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response
from quart_schema import document_response, validate_querystring, validate_request
from sqlalchemy import Connection

from plugins.billing import invoices, payments, subscriptions
from plugins.billing.clock import TestClock
from plugins.billing.errors import (
    PaymentFailed,
    ProviderUnsupported,
    SubscriptionActive,
    TierUnknown,
)
from plugins.billing.events import NO_FLOW, emit
from plugins.billing.invoices import Invoice
from plugins.billing.providers import ChargeDeclined, Opened, Provider
from plugins.billing.providers.usdt_bep20 import UsdtBep20
from plugins.billing.scheduler import move_clock
from plugins.billing.state import BILLING, BillingState
from plugins.billing.subscriptions import ACTIVE, NO_SUBSCRIPTION
from plugins.billing.tiers import PRICE_MICRO, TIERS, Tier, format_usd, prorate, rank
from runtime.context import require_internal, require_user
from runtime.errors import Conflict, InvalidRequest, NotFound, Unavailable
from runtime.http import current_service, json_response
from runtime.inputs import Body
from runtime.service import Service
from runtime.wire import iso

PAGE_DEFAULT, PAGE_MAX = 20, 100
OUTCOMES = ("granted", "duplicate", "late", "short", "over", "unmatched", "conflict")


class CheckoutRequest(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"tier": "pro", "provider": "crypto_bot"}]})
    tier: str = Field(max_length=32, description="plus, pro or max",
                      json_schema_extra={"enum": list(TIERS)})
    provider: str = Field(max_length=32, description="crypto_bot, gateway or usdt_bep20")


class ChangeRequest(Body):
    tier: str = Field(max_length=32, description="plus, pro or max",
                      json_schema_extra={"enum": list(TIERS)})


class ClockRequest(Body):
    advanceSeconds: float = Field(ge=0, le=10 * 366 * 86400)


class PageQuery(BaseModel):
    cursor: str | None = None
    limit: int = Field(PAGE_DEFAULT, ge=1)


class PaymentsQuery(PageQuery):
    outcome: str | None = None


class CheckoutResponse(BaseModel):
    subscriptionId: str
    tier: str
    provider: str
    checkoutUrl: str
    expiresAt: str
    invoiceId: str
    amountUsd: str
    payment: dict[str, Any] | None


class SubscriptionResponse(BaseModel):
    subscriptionId: str | None
    tier: Literal["none"] | Tier
    status: Literal["none", "pending", "active", "grace", "canceled", "ended"]
    renewsAt: str | None
    provider: str | None
    features: dict[str, bool]
    nextTier: str | None
    periodStart: str | None
    endsAt: str | None
    graceEndsAt: str | None
    openInvoice: dict[str, Any] | None


class PaymentsResponse(BaseModel):
    payments: list[dict[str, Any]]
    nextCursor: str | None


class ClockResponse(BaseModel):
    now: str
    offsetSeconds: float


blueprint = Blueprint("billing", __name__)


def _tier(value: str) -> str:
    if value not in TIERS:
        raise TierUnknown(f"tier must be one of {', '.join(TIERS)}, not {value!r}")
    return value


def _provider(state: BillingState, name: str) -> Provider:
    provider = state.providers.get(name)
    if provider is None:
        enabled = ", ".join(sorted(state.providers)) or "none"
        raise ProviderUnsupported(f"provider {name!r} is not enabled here (enabled: {enabled})")
    return provider


def _payment_of(state: BillingState, invoice: Invoice) -> dict[str, Any] | None:
    """How to pay a ``usdt_bep20`` invoice (chain, token, treasury, exact amount)."""
    provider = state.providers.get(invoice.provider)
    if not isinstance(provider, UsdtBep20) or invoice.token_amount is None:
        return None
    return provider.describe(invoice.token_amount)


async def open_with_provider(service: Service, provider: Provider, invoice: Invoice) -> Opened:
    """Open ``invoice`` with its provider and keep its URL.

    :raises Unavailable: the provider cannot open it (the invoice is marked failed).
    """
    try:
        opened = await provider.checkout(invoice.order(service.state(BILLING).clock.now()))
    except Unavailable:
        await service.db.write(invoices.set_status, invoice.id, invoices.FAILED)
        raise
    await service.db.write(invoices.record_opened, invoice.id, opened)
    return opened


async def _subscription_body(service: Service, user_id: int) -> dict[str, Any]:
    state = service.state(BILLING)
    now = state.clock.now()

    def read(connection: Connection) -> dict[str, Any]:
        found = subscriptions.current(connection, user_id)
        if found is None:
            return {**NO_SUBSCRIPTION, "openInvoice": None}
        invoice = invoices.open_of(connection, found.id, now) \
            if found.status in (ACTIVE, subscriptions.GRACE) else None
        return {**found.public(now), "openInvoice": None if invoice is None
                else invoice.public(_payment_of(state, invoice))}

    return await service.db.read(read)


@blueprint.post("/subscriptions/checkout")
@validate_request(CheckoutRequest)
@document_response(CheckoutResponse, 201)
async def checkout(data: CheckoutRequest) -> Response:
    """Start a subscription: an invoice with the provider; the tier activates once paid."""
    service = current_service()
    principal = require_user()
    state = service.state(BILLING)
    tier = _tier(data.tier)
    provider = _provider(state, data.provider)
    now = state.clock.now()

    def open_checkout(connection: Connection) -> Invoice:
        if subscriptions.live_with_tier(service, connection, principal.user_id, now):
            raise SubscriptionActive("you already have a subscription; change its tier with "
                                     "POST /me/subscription/change")
        subscription_id = subscriptions.insert_pending(connection, principal.user_id, tier,
                                                       provider.name, now)
        return invoices.create(
            connection, subscription_id=subscription_id, user_id=principal.user_id,
            purpose="checkout", tier=tier, provider=provider.name,
            amount_micro=PRICE_MICRO[tier], now=now,
            expires_at=now + timedelta(minutes=state.settings.checkout_expiry_minutes),
            token_decimals=state.token_decimals(provider.name))

    invoice = await service.db.write(open_checkout)
    opened = await open_with_provider(service, provider, invoice)
    return json_response({
        "subscriptionId": str(invoice.subscription_id), "tier": tier,
        "provider": provider.name, "checkoutUrl": opened.url,
        "expiresAt": iso(invoice.expires_at), "invoiceId": str(invoice.id),
        "amountUsd": format_usd(invoice.amount_micro), "payment": opened.payment}, 201)


@blueprint.get("/me/subscription")
@document_response(SubscriptionResponse, 200)
async def my_subscription() -> Response:
    """The caller's subscription: tier ``none`` and status ``none`` if they never had one."""
    service = current_service()
    return json_response(await _subscription_body(service, require_user().user_id))


@blueprint.post("/me/subscription/cancel")
@document_response(SubscriptionResponse, 200)
async def cancel() -> Response:
    """Cancel at the end of the period (at once in grace); answers the subscription."""
    service = current_service()
    principal = require_user()
    now = service.state(BILLING).clock.now()

    def cancel_live(connection: Connection) -> None:
        subscription = subscriptions.cancel(service, connection, principal.user_id, now)
        invoices.void_open(connection, subscription_id=subscription.id)

    await service.db.write(cancel_live)
    return json_response(await _subscription_body(service, principal.user_id))


@blueprint.post("/me/subscription/change")
@validate_request(ChangeRequest)
@document_response(SubscriptionResponse, 200)
async def change_tier(data: ChangeRequest) -> Response:
    """Upgrade now (the pro-rated difference is charged or invoiced) or downgrade at the
    next period; the same tier drops a scheduled downgrade."""
    service = current_service()
    principal = require_user()
    state = service.state(BILLING)
    tier = _tier(data.tier)
    now = state.clock.now()

    def plan(connection: Connection) -> tuple[Invoice, str | None] | None:
        subscription = subscriptions.live_with_tier(service, connection, principal.user_id,
                                                    now)
        if subscription is None:
            raise NotFound("you have no subscription to change")
        if subscription.status != ACTIVE:
            raise Conflict(f"the subscription is {subscription.status}: only an active "
                           f"subscription changes tier")
        assert subscription.renews_at is not None and subscription.period_start is not None
        if rank(tier) <= rank(subscription.tier):
            subscriptions.change(connection, subscription, now,
                                 next_tier=None if tier == subscription.tier else tier)
            return None
        amount = prorate(subscription.tier, tier,
                         int((subscription.renews_at - now).total_seconds()),
                         int((subscription.renews_at - subscription.period_start)
                             .total_seconds()))
        if amount == 0:
            subscriptions.change(connection, subscription, now, tier=tier, next_tier=None)
            emit(service, connection, principal.user_id, "subscription.granted",
                 subscription.id, tier=tier, amount_flow=NO_FLOW, purpose="upgrade",
                 renews_at=iso(subscription.renews_at))
            return None
        _provider(state, subscription.provider)
        invoices.void_open(connection, subscription_id=subscription.id, purpose="upgrade")
        invoice = invoices.create(
            connection, subscription_id=subscription.id, user_id=principal.user_id,
            purpose="upgrade", tier=tier, provider=subscription.provider,
            amount_micro=amount, now=now, period_end=subscription.renews_at,
            expires_at=min(subscription.renews_at, now + timedelta(
                minutes=state.settings.checkout_expiry_minutes)),
            token_decimals=state.token_decimals(subscription.provider))
        return invoice, subscription.customer_ref

    planned = await service.db.write(plan)
    status = 200
    if planned is not None:
        invoice, customer = planned
        provider = _provider(state, invoice.provider)
        if provider.off_session and customer is not None:
            await _charge_upgrade(service, provider, invoice, customer)
        else:
            await open_with_provider(service, provider, invoice)
            status = 202
    return json_response(await _subscription_body(service, principal.user_id), status)


async def _charge_upgrade(service: Service, provider: Provider, invoice: Invoice,
                          customer: str) -> None:
    """Charge an upgrade's pro-rated difference to the saved card now.

    :raises PaymentFailed: the gateway declined it (the tier stays).
    :raises Conflict: it was paid but no longer fits the subscription (recorded).
    """
    now = service.state(BILLING).clock.now()
    try:
        payment = await provider.charge(invoice.order(now), customer)
    except ChargeDeclined as exc:
        await service.db.write(invoices.set_status, invoice.id, invoices.FAILED)
        raise PaymentFailed(f"the upgrade was not charged: {exc}") from None
    outcome = await service.db.write(
        lambda connection: payments.settle(service, connection, payment))
    if outcome not in ("granted", payments.REPEATED):
        raise Conflict(f"the upgrade was paid but not applied ({outcome}); the payment is "
                       f"recorded in GET /me/subscription/payments")


def _page(query: PageQuery) -> tuple[int | None, int]:
    before = None
    if query.cursor is not None:
        if not (query.cursor.isascii() and query.cursor.isdigit() and len(query.cursor) < 19):
            raise InvalidRequest("cursor is not a cursor this endpoint returned",
                                 details=[{"field": "cursor", "message": "unknown cursor"}])
        before = int(query.cursor)
    return before, min(query.limit, PAGE_MAX)


async def _payments_page(service: Service, query: PageQuery, **where: Any) -> Response:
    before, limit = _page(query)
    page = await service.db.read(lambda connection: payments.payment_list(
        connection, before=before, limit=limit + 1, **where))
    more = len(page) > limit
    page = page[:limit]
    return json_response({"payments": page,
                          "nextCursor": page[-1]["paymentId"] if more else None})


@blueprint.get("/me/subscription/payments")
@validate_querystring(PageQuery)
@document_response(PaymentsResponse, 200)
async def my_payments(query_args: PageQuery) -> Response:
    """Every payment of the caller, newest first, with its outcome (granted, late, short...)."""
    return await _payments_page(current_service(), query_args, user_id=require_user().user_id)


@blueprint.get("/internal/billing/payments")
@validate_querystring(PaymentsQuery)
@document_response(PaymentsResponse, 200)
async def all_payments(query_args: PaymentsQuery) -> Response:
    """Operators: every payment, newest first, optionally of one outcome (``unmatched``)."""
    require_internal()
    if query_args.outcome is not None and query_args.outcome not in OUTCOMES:
        raise InvalidRequest(f"outcome must be one of {', '.join(OUTCOMES)}",
                             details=[{"field": "outcome", "message": "unknown outcome"}])
    return await _payments_page(current_service(), query_args, outcome=query_args.outcome)


def _clock_body(state: BillingState) -> dict[str, Any]:
    clock = state.clock
    offset = clock.offset.total_seconds() if isinstance(clock, TestClock) else 0.0
    return {"now": iso(clock.now()), "offsetSeconds": offset}


@blueprint.get("/internal/billing/clock")
@document_response(ClockResponse, 200)
async def read_clock() -> Response:
    """The billing clock's time and its offset from the real time."""
    require_internal()
    return json_response(_clock_body(current_service().state(BILLING)))


@blueprint.post("/internal/billing/clock")
@validate_request(ClockRequest)
@document_response(ClockResponse, 200)
async def advance_clock(data: ClockRequest) -> Response:
    """Development and tests only (``test_clock = true``): move the billing clock forward in
    every process."""
    require_internal()
    service = current_service()
    state = service.state(BILLING)
    if not isinstance(state.clock, TestClock):
        raise NotFound("the billing test clock is off ([plugins.billing] test_clock)")
    await move_clock(service, state.clock, data.advanceSeconds)
    return json_response(_clock_body(state))
