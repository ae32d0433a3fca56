"""Subscriptions: who gets which events at which URL, and the secret that signs them.

Functions here run inside a database transaction (``service.db.write`` / ``read``); the
routes vet URLs and event names before calling them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, update

from plugins.webhooks.errors import WebhookLimitReached
from plugins.webhooks.signing import new_secret
from plugins.webhooks.tables import subscriptions
from runtime.errors import NotFound
from runtime.wire import as_utc, iso, utcnow


@dataclass(frozen=True)
class Subscription:
    """One webhook subscription as stored; ``events == []`` means every event type."""

    id: int
    user_id: int
    url: str
    host: str
    events: list[str]
    secret: str
    previous_secret: str | None
    previous_secret_until: datetime | None
    created_at: datetime
    last_error: str | None
    last_error_at: datetime | None

    def public(self, *, with_secret: bool = False) -> dict[str, Any]:
        """The wire shape; the secret only when just created or rotated."""
        body: dict[str, Any] = {
            "id": str(self.id), "url": self.url, "events": list(self.events),
            "created_at": iso(self.created_at), "last_error": self.last_error,
            "last_error_at": iso(self.last_error_at) if self.last_error_at else None,
        }
        if with_secret:
            body["secret"] = self.secret
        return body

    def wants(self, event_name: str) -> bool:
        """Whether an event of this name goes to this subscription."""
        return not self.events or event_name in self.events


def signing_secrets(secret: str, previous: str | None, previous_until: datetime | None,
                    now: datetime) -> list[str]:
    """The secrets a delivery is signed with now: the current one, and the rotated-out one
    while its overlap lasts."""
    if previous and previous_until is not None and as_utc(previous_until) > now:
        return [secret, previous]
    return [secret]


def _subscription(row: Any) -> Subscription:
    return Subscription(
        id=row.id, user_id=row.user_id, url=row.url, host=row.host, events=list(row.events),
        secret=row.secret, previous_secret=row.previous_secret,
        previous_secret_until=as_utc(row.previous_secret_until)
        if row.previous_secret_until else None,
        created_at=as_utc(row.created_at), last_error=row.last_error,
        last_error_at=as_utc(row.last_error_at) if row.last_error_at else None)


def create_subscription(connection: Connection, user_id: int, url: str, host: str,
                        events: Sequence[str], limit: int) -> Subscription:
    """Store a new subscription with a fresh secret.

    :raises WebhookLimitReached: the user already has ``limit`` subscriptions.
    """
    count = connection.execute(select(func.count()).select_from(subscriptions)
                               .where(subscriptions.c.user_id == user_id)).scalar_one()
    if count >= limit:
        raise WebhookLimitReached(f"you already have {count} webhooks, the most allowed; "
                                  "delete one first")
    new_id = connection.execute(insert(subscriptions).values(
        user_id=user_id, url=url, host=host, events=list(events), secret=new_secret(),
        created_at=utcnow())).inserted_primary_key[0]  # type: ignore[index]
    return get_subscription(connection, user_id, int(new_id))


def list_subscriptions(connection: Connection, user_id: int, *, lock: bool = False
                       ) -> list[Subscription]:
    """The user's subscriptions, oldest first. ``lock`` takes the row locks a foreign key
    check takes (``FOR KEY SHARE`` on PostgreSQL; SQLite writers are serialized anyway): none
    of them can be deleted before the transaction ends, yet updates of them do not wait."""
    query = select(subscriptions).where(subscriptions.c.user_id == user_id)
    if lock:
        query = query.with_for_update(read=True, key_share=True)
    return [_subscription(row) for row in connection.execute(query.order_by(subscriptions.c.id))]


def get_subscription(connection: Connection, user_id: int, subscription_id: int, *,
                     lock: bool = False) -> Subscription:
    """The caller's subscription ``subscription_id``; ``lock`` as ``list_subscriptions``.

    :raises NotFound: it does not exist or belongs to someone else.
    """
    query = select(subscriptions).where(subscriptions.c.id == subscription_id,
                                        subscriptions.c.user_id == user_id)
    if lock:
        query = query.with_for_update(read=True, key_share=True)
    row = connection.execute(query).first()
    if row is None:
        raise NotFound("no such webhook")
    return _subscription(row)


def delete_subscription(connection: Connection, user_id: int, subscription_id: int) -> None:
    """Delete the subscription; its deliveries and attempts go with it (cascade), so
    nothing pending is sent any more.

    :raises NotFound: it does not exist or belongs to someone else.
    """
    deleted = connection.execute(delete(subscriptions).where(
        subscriptions.c.id == subscription_id, subscriptions.c.user_id == user_id)).rowcount
    if not deleted:
        raise NotFound("no such webhook")


def rotate_secret(connection: Connection, user_id: int, subscription_id: int,
                  overlap_seconds: int) -> Subscription:
    """Give the subscription a new secret; the old one keeps signing for ``overlap_seconds``.

    :raises NotFound: it does not exist or belongs to someone else.
    """
    current = get_subscription(connection, user_id, subscription_id)
    keep_old = overlap_seconds > 0
    connection.execute(update(subscriptions).where(subscriptions.c.id == subscription_id).values(
        secret=new_secret(),
        previous_secret=current.secret if keep_old else None,
        previous_secret_until=utcnow() + timedelta(seconds=overlap_seconds) if keep_old else None))
    return get_subscription(connection, user_id, subscription_id)


def record_last_error(connection: Connection, subscription_id: int, error: str,
                      at: datetime) -> None:
    connection.execute(update(subscriptions).where(subscriptions.c.id == subscription_id)
                       .values(last_error=error, last_error_at=at))
