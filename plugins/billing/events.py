"""The webhook events billing declares, and how it emits them (inside the changing transaction).

Amounts are decimal strings with 6 decimals. ``amount_flow`` is the FLOW credited by the
payment: subscriptions are feature gates and grant no FLOW, so it is always ``"0.000000"``
(the field stays for integrators who read it from the spec's payload list).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from runtime.events import EventType
from runtime.service import Service

NO_FLOW = "0.000000"
EVENT_TYPES = [
    EventType("payment.received", "A payment reached the service through a provider "
              "(provider, amount_usd, amount_flow, outcome: granted, or why it granted nothing)."),
    EventType("subscription.granted", "A subscription tier became active, was renewed or "
              "upgraded after the provider confirmed payment (tier, amount_flow)."),
    EventType("subscription.grace", "A renewal payment failed: the subscription is in grace, "
              "its features stay live and payment is retried daily (tier, grace_ends_at)."),
    EventType("subscription.canceled", "The subscription will not renew: canceled by the user "
              "or after the last retry of grace failed (tier, reason, ends_at)."),
    EventType("subscription.ended", "The subscription's tier is gone: a canceled subscription "
              "lapsed (tier, reason)."),
]


def emit(service: Service, connection: Connection, user_id: int, name: str,
         subscription_id: int, **data: Any) -> None:
    """Emit ``name`` for ``user_id`` about subscription ``subscription_id`` on ``connection``."""
    service.emit_event(connection, user_id=user_id, name=name,
                       data={**data, "subscription_id": str(subscription_id)})
