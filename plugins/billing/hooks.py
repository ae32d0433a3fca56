"""Hook implementations of the billing plugin (for now: its webhook event declarations)."""

from __future__ import annotations

from runtime.events import EventType
from runtime.hookspecs import hookimpl


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [
        EventType("payment.received", "A payment reached the service through a provider "
                  "(provider, amount_usd, amount_flow)."),
        EventType("subscription.granted", "A subscription tier became active after the "
                  "provider confirmed payment (tier, amount_flow)."),
        EventType("payout.sent", "A payout was sent on chain (payout_id, amount_flow, tx_hash); "
                  "payouts are deprecated."),
        EventType("payout.failed", "A payout could not be sent (payout_id, amount_flow, reason); "
                  "payouts are deprecated."),
    ]
