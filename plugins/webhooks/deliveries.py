"""Deliveries as the subscriber sees them: history, the test ping, redelivery and recovery.

Functions here run inside a database transaction. Each takes the caller's user id and a
subscription id and raises ``NotFound`` when that subscription is not the caller's.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select, update

from plugins.webhooks.errors import DeliveryPending
from plugins.webhooks.outbox import write_event
from plugins.webhooks.subscriptions import Subscription, get_subscription
from plugins.webhooks.tables import FAILED, PENDING, attempts, deliveries, events
from runtime.errors import NotFound
from runtime.events import OutboundEvent
from runtime.wire import iso, utcnow

PING_EVENT = "webhook.ping"
ATTEMPTS_SHOWN = 20


def _time(value: datetime | None) -> str | None:
    return iso(value) if value is not None else None


def _attempt_public(row: Any) -> dict[str, Any]:
    return {"attempt": row.number, "at": iso(row.started_at), "duration_ms": row.duration_ms,
            "status_code": row.status_code, "error": row.error, "outcome": row.outcome,
            "response_excerpt": row.response_excerpt}


def _delivery_public(row: Any, tried: list[dict[str, Any]]) -> dict[str, Any]:
    return {"event_id": row.event_id, "event": row.name, "state": row.state,
            "created_at": iso(row.created_at), "next_attempt_at": _time(row.next_attempt_at),
            "finished_at": _time(row.finished_at), "attempts": tried}


def _delivery_rows(subscription_id: int) -> Any:
    return (select(deliveries.c.id, deliveries.c.event_id, deliveries.c.state,
                   deliveries.c.created_at, deliveries.c.next_attempt_at,
                   deliveries.c.finished_at, events.c.name)
            .join(events, events.c.id == deliveries.c.event_id)
            .where(deliveries.c.subscription_id == subscription_id))


def _with_attempts(connection: Connection, rows: list[Any]) -> list[dict[str, Any]]:
    by_delivery: dict[int, list[dict[str, Any]]] = {row.id: [] for row in rows}
    if rows:
        for attempt in connection.execute(select(attempts).where(
                attempts.c.delivery_id.in_(list(by_delivery))).order_by(attempts.c.id)):
            by_delivery[attempt.delivery_id].append(_attempt_public(attempt))
    return [_delivery_public(row, by_delivery[row.id][-ATTEMPTS_SHOWN:]) for row in rows]


def list_deliveries(connection: Connection, user_id: int, subscription_id: int, *, limit: int,
                    before: int | None, state: str | None, event: str | None
                    ) -> tuple[list[dict[str, Any]], str | None]:
    """The subscription's deliveries (of ``event`` type and in ``state``, when given), newest
    first, each with its latest attempts; and the cursor of the next page (None on the last
    page)."""
    subscription = get_subscription(connection, user_id, subscription_id)
    query = _delivery_rows(subscription.id)
    if before is not None:
        query = query.where(deliveries.c.id < before)
    if state is not None:
        query = query.where(deliveries.c.state == state)
    if event is not None:
        query = query.where(events.c.name == event)
    rows = connection.execute(query.order_by(deliveries.c.id.desc()).limit(limit + 1)).all()
    page = list(rows[:limit])
    cursor = str(page[-1].id) if len(rows) > limit else None
    return _with_attempts(connection, page), cursor


def _one_delivery(connection: Connection, subscription: Subscription,
                  event_id: str) -> dict[str, Any]:
    row = connection.execute(_delivery_rows(subscription.id)
                             .where(deliveries.c.event_id == event_id)).first()
    if row is None:
        raise NotFound("this webhook has no delivery of that event")
    return _with_attempts(connection, [row])[0]


def send_ping(connection: Connection, user_id: int, subscription_id: int, retries: int
              ) -> dict[str, Any]:
    """Queue a ``webhook.ping`` event for this subscription alone; return its delivery.

    The ping is not in the event catalogue: it goes to the subscription it was asked for,
    whatever its ``events`` filter, and through the same outbox, signing and retries as any
    other event.
    """
    subscription = get_subscription(connection, user_id, subscription_id, lock=True)
    event = OutboundEvent.new(
        PING_EVENT, subscription.user_id,
        {"webhook_id": str(subscription.id), "message": "test ping from flowsvc"})
    write_event(connection, event, [subscription.id], retries)
    return _one_delivery(connection, subscription, event.id)


def redeliver(connection: Connection, user_id: int, subscription_id: int, event_id: str,
              retries: int) -> dict[str, Any]:
    """Schedule a finished delivery of ``event_id`` again, now, with a fresh retry budget.

    :raises NotFound: the subscription never had a delivery of that event (or it was purged).
    :raises DeliveryPending: the delivery is still scheduled or being sent.
    """
    subscription = get_subscription(connection, user_id, subscription_id)
    row = connection.execute(select(deliveries.c.state).where(
        deliveries.c.subscription_id == subscription.id,
        deliveries.c.event_id == event_id)).first()
    if row is None:
        raise NotFound("this webhook has no delivery of that event")
    if row.state == PENDING:
        raise DeliveryPending("that event is still being delivered; wait for it to finish")
    connection.execute(update(deliveries).where(
        deliveries.c.subscription_id == subscription.id, deliveries.c.event_id == event_id,
        deliveries.c.state != PENDING).values(**_rescheduled(retries)))
    return _one_delivery(connection, subscription, event_id)


def recover(connection: Connection, user_id: int, subscription_id: int, since: datetime,
            until: datetime, retries: int) -> int:
    """Schedule again every failed delivery of events created in ``[since, until)``; return
    how many."""
    subscription = get_subscription(connection, user_id, subscription_id)
    return connection.execute(update(deliveries).where(
        deliveries.c.subscription_id == subscription.id, deliveries.c.state == FAILED,
        deliveries.c.created_at >= since, deliveries.c.created_at < until,
    ).values(**_rescheduled(retries))).rowcount


def _rescheduled(retries: int) -> dict[str, Any]:
    return {"state": PENDING, "retries_left": retries, "next_attempt_at": utcnow(),
            "finished_at": None, "claimed_until": None, "claim_owner": None}
