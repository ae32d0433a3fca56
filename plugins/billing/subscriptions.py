"""Subscription records and their transitions (docs/billing.md draws the state machine).

Stored statuses: ``pending`` (a checkout not paid yet, never shown), ``active``, ``grace``,
``canceled`` (will not renew; the tier stays until ``ends_at``) and ``ended`` (the tier is
gone; shown as ``canceled`` with tier ``none``). A row is *live* (``live_user_id`` set) from
activation until it ends; the unique ``live_user_id`` keeps one live subscription per user.

``due_at`` is when the scheduler must act next: the renewal (for invoice providers,
``renewal_notice_hours`` earlier, to send the renewal invoice), a daily retry of grace, or
the end of a canceled period. Every transition the scheduler makes is a compare-and-set on
``version``, so a row changed meanwhile (a payment arrived) is never overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import Connection, func, insert, not_, or_, select, update

from plugins.billing.events import emit
from plugins.billing.tables import subscriptions
from plugins.billing.tiers import features
from runtime.errors import NotFound
from runtime.service import Service
from runtime.wire import as_utc, iso

PENDING, ACTIVE, GRACE, CANCELED, ENDED = "pending", "active", "grace", "canceled", "ended"
LIVE = (ACTIVE, GRACE, CANCELED)
GRACE_RETRIES = 7
RETRY_EVERY = timedelta(days=1)
GRACE_PERIOD = GRACE_RETRIES * RETRY_EVERY
_CLAIM_CLEARED = {"claim_owner": None, "claimed_until": None}


def _time(value: Any) -> datetime | None:
    return as_utc(value) if value is not None else None


@dataclass(frozen=True)
class Subscription:
    id: int
    user_id: int
    tier: str
    next_tier: str | None
    provider: str
    status: str
    period_start: datetime | None
    renews_at: datetime | None
    ends_at: datetime | None
    retries: int
    due_at: datetime | None
    customer_ref: str | None
    end_reason: str | None
    version: int

    @classmethod
    def of(cls, row: Any) -> Subscription:
        return cls(id=int(row.id), user_id=int(row.user_id), tier=row.tier,
                   next_tier=row.next_tier, provider=row.provider, status=row.status,
                   period_start=_time(row.period_start), renews_at=_time(row.renews_at),
                   ends_at=_time(row.ends_at), retries=int(row.retries),
                   due_at=_time(row.due_at), customer_ref=row.customer_ref,
                   end_reason=row.end_reason, version=int(row.version))

    @property
    def grace_ends_at(self) -> datetime | None:
        return self.renews_at + GRACE_PERIOD if self.renews_at is not None else None

    def live_tier(self, now: datetime) -> str | None:
        """The tier whose features the user has at ``now`` (None: no tier). Judged by the
        clock, so a lapse takes effect on time even before the scheduler records it."""
        if self.status == ACTIVE:
            return self.tier
        if self.status == GRACE:
            return self.tier if self.grace_ends_at and now < self.grace_ends_at else None
        if self.status == CANCELED:
            return self.tier if self.ends_at and now < self.ends_at else None
        return None

    def public(self, now: datetime) -> dict[str, Any]:
        """The spec's Subscription resource, plus ``nextTier``, ``endsAt``, ``graceEndsAt``.

        ``renewsAt`` is the next renewal (active), the next retry (grace), and once canceled
        the end of the period, when the tier goes (the spec keeps the tier "until
        ``renewsAt``"; it equals ``endsAt`` then)."""
        tier = self.live_tier(now)
        renews_at = {ACTIVE: self.renews_at, GRACE: self.due_at, CANCELED: self.ends_at,
                     ENDED: self.ends_at}.get(self.status)
        return {"subscriptionId": str(self.id), "tier": tier or "none",
                "status": CANCELED if self.status == ENDED else self.status,
                "renewsAt": _iso(renews_at), "provider": self.provider,
                "features": features(tier), "nextTier": self.next_tier,
                "periodStart": _iso(self.period_start), "endsAt": _iso(self.ends_at),
                "graceEndsAt": _iso(self.grace_ends_at) if self.status == GRACE else None}


NO_SUBSCRIPTION: dict[str, Any] = {
    "subscriptionId": None, "tier": "none", "status": "none", "renewsAt": None,
    "provider": None, "features": features(None), "nextTier": None, "periodStart": None,
    "endsAt": None, "graceEndsAt": None}


def _iso(moment: datetime | None) -> str | None:
    return iso(moment) if moment is not None else None


def get(connection: Connection, subscription_id: int, *, lock: bool = False
        ) -> Subscription | None:
    query = select(subscriptions).where(subscriptions.c.id == subscription_id)
    row = connection.execute(query.with_for_update() if lock else query).first()
    return Subscription.of(row) if row else None


def live(connection: Connection, user_id: int, *, lock: bool = False) -> Subscription | None:
    """The user's live subscription (active, in grace, or canceled before its end)."""
    query = select(subscriptions).where(subscriptions.c.live_user_id == user_id)
    row = connection.execute(query.with_for_update() if lock else query).first()
    return Subscription.of(row) if row else None


def live_with_tier(service: Service, connection: Connection, user_id: int, now: datetime
                   ) -> Subscription | None:
    """The user's live subscription if it still gives a tier at ``now``, locked; one whose
    time is up but that the scheduler has not ended yet is ended here first."""
    subscription = live(connection, user_id, lock=True)
    if subscription is None or subscription.live_tier(now) is not None:
        return subscription
    end(service, connection, subscription, now,
        "payment_failed" if subscription.status == GRACE else "user")
    return None


def current(connection: Connection, user_id: int) -> Subscription | None:
    """What ``GET /me/subscription`` shows: the live subscription, else the last that ended."""
    row = connection.execute(
        select(subscriptions).where(subscriptions.c.user_id == user_id)
        .where(subscriptions.c.status.in_((*LIVE, ENDED)))
        .order_by(subscriptions.c.live_user_id.is_(None), subscriptions.c.id.desc())
        .limit(1)).first()
    return Subscription.of(row) if row else None


def insert_pending(connection: Connection, user_id: int, tier: str, provider: str,
                   now: datetime) -> int:
    """A subscription waiting for its checkout to be paid; its id."""
    return int(connection.execute(insert(subscriptions).values(
        user_id=user_id, tier=tier, provider=provider, status=PENDING, retries=0, version=0,
        created_at=now, updated_at=now)).inserted_primary_key[0])  # type: ignore[index]


def change(connection: Connection, subscription: Subscription, now: datetime,
           **values: Any) -> bool:
    """Compare-and-set: write ``values`` if the row is still at ``subscription.version``
    (the claim is released too); False when someone changed it meanwhile."""
    result = connection.execute(
        update(subscriptions).where(subscriptions.c.id == subscription.id)
        .where(subscriptions.c.version == subscription.version)
        .values(**values, **_CLAIM_CLEARED, version=subscription.version + 1, updated_at=now))
    return result.rowcount == 1


def cancel(service: Service, connection: Connection, user_id: int, now: datetime
           ) -> Subscription:
    """Cancel the user's live subscription: an active one keeps its tier until
    ``renews_at``; one in grace (its period unpaid) ends now; a canceled one is left as is.

    :raises NotFound: the user has no live subscription.
    """
    subscription = live(connection, user_id, lock=True)
    if subscription is None:
        raise NotFound("you have no subscription to cancel")
    if subscription.status == ACTIVE:
        assert subscription.renews_at is not None
        change(connection, subscription, now, status=CANCELED, ends_at=subscription.renews_at,
               due_at=subscription.renews_at, next_tier=None, end_reason="user")
        emit(service, connection, user_id, "subscription.canceled", subscription.id,
             tier=subscription.tier, reason="user", ends_at=iso(subscription.renews_at))
    elif subscription.status == GRACE:
        end(service, connection, subscription, now, "user")
    found = get(connection, subscription.id)
    assert found is not None
    return found


def end(service: Service, connection: Connection, subscription: Subscription, now: datetime,
        reason: str) -> bool:
    """The tier is gone: ``ended`` (shown ``canceled``, tier ``none``). From grace (the user
    canceled, or the last retry failed) it is canceled and ended at once."""
    if not change(connection, subscription, now, status=ENDED, live_user_id=None,
                  ends_at=subscription.ends_at if subscription.status == CANCELED else now,
                  due_at=None, next_tier=None,
                  end_reason=subscription.end_reason if subscription.status == CANCELED
                  else reason):
        return False
    if subscription.status == GRACE:
        emit(service, connection, subscription.user_id, "subscription.canceled",
             subscription.id, tier=subscription.tier, reason=reason, ends_at=iso(now))
    emit(service, connection, subscription.user_id, "subscription.ended", subscription.id,
         tier=subscription.tier, reason=subscription.end_reason or reason)
    return True


def fail_renewal(service: Service, connection: Connection, subscription: Subscription,
                 now: datetime, reason: str) -> bool:
    """A renewal attempt failed: an active subscription enters grace (a retry a day); in
    grace one more retry is spent, and the seventh failed retry cancels it."""
    assert subscription.renews_at is not None
    if subscription.status == ACTIVE:
        if not change(connection, subscription, now, status=GRACE, retries=0,
                      due_at=subscription.renews_at + RETRY_EVERY):
            return False
        emit(service, connection, subscription.user_id, "subscription.grace", subscription.id,
             tier=subscription.tier, reason=reason,
             grace_ends_at=iso(subscription.renews_at + GRACE_PERIOD))
        return True
    retries = subscription.retries + 1
    if retries >= GRACE_RETRIES:
        return end(service, connection, subscription, now, "payment_failed")
    return change(connection, subscription, now, retries=retries,
                  due_at=subscription.renews_at + (retries + 1) * RETRY_EVERY)


def claim_due(connection: Connection, now: datetime, real_now: datetime, owner: str,
              lease: timedelta, limit: int) -> list[Subscription]:
    """Lease up to ``limit`` live subscriptions due by ``now`` to ``owner``.

    On PostgreSQL the candidates are read ``FOR UPDATE SKIP LOCKED`` (another process's
    pass skips them instead of waiting); on SQLite every write transaction is ``BEGIN
    IMMEDIATE``. Either way each claim is a compare-and-set on ``version``: a row is
    claimed by one process at a time, until its lease (real time) ends.
    """
    rows = connection.execute(
        select(subscriptions).where(subscriptions.c.status.in_(LIVE))
        .where(subscriptions.c.due_at <= now)
        .where(or_(subscriptions.c.claimed_until.is_(None),
                   subscriptions.c.claimed_until < real_now))
        .order_by(subscriptions.c.due_at).limit(limit)
        .with_for_update(skip_locked=True)).all()
    claimed = []
    for row in rows:
        result = connection.execute(
            update(subscriptions).where(subscriptions.c.id == row.id)
            .where(subscriptions.c.version == row.version)
            .values(claim_owner=owner, claimed_until=real_now + lease,
                    version=row.version + 1))
        if result.rowcount == 1:
            claimed.append(replace(Subscription.of(row), version=row.version + 1))
    return claimed


def seconds_to_next(connection: Connection, now: datetime, real_now: datetime
                    ) -> float | None:
    """Seconds until the scheduler may have work: the earliest ``due_at`` nobody holds (on
    the billing clock), or the earliest lease on due work that ends (real time); None
    when no live subscription has anything scheduled."""
    free = or_(subscriptions.c.claimed_until.is_(None), subscriptions.c.claimed_until < real_now)
    live_rows = (subscriptions.c.status.in_(LIVE), subscriptions.c.due_at.is_not(None))
    due = _time(connection.execute(
        select(func.min(subscriptions.c.due_at)).where(*live_rows, free)).scalar())
    lease = _time(connection.execute(
        select(func.min(subscriptions.c.claimed_until))
        .where(*live_rows, subscriptions.c.due_at <= now, not_(free))).scalar())
    waits = [(due - now).total_seconds()] if due is not None else []
    if lease is not None:
        waits.append((lease - real_now).total_seconds())
    return min(waits, default=None)
