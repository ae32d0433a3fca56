"""Subscriptions to agents of the ``subscription`` model.

A subscription buys ``periodDays`` days of use of one agent for ``priceFlow``, charged to
the subscriber's API key and credited to the owner. At the end of a period the scheduler
renews it (charging the key again, at the agent's price then) only when the subscriber
did not cancel, the agent is still published and still sold by subscription, and the key
can pay; otherwise the subscription ends at the period's end. So unpublishing an agent
never cuts a period short: subscribers keep using it until their period ends, and no
subscription to it is renewed.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Select, insert, select, update

from plugins.marketplace.catalog import Agent, load_agent
from plugins.marketplace.charges import charge_key
from plugins.marketplace.ledger import Earning, credit
from plugins.marketplace.tables import agents, subscriptions
from runtime.errors import Conflict, NotFound, ServiceError, Unavailable
from runtime.wire import as_utc, format_flow, iso, utcnow

if TYPE_CHECKING:
    from runtime.service import Service

log = logging.getLogger("flowsvc.marketplace")
SETTLE_BATCH = 200


@dataclass(frozen=True)
class Subscription:
    """One user's subscription to one agent (at most one row per pair, reused)."""

    id: int
    agent_id: int
    agent_slug: str
    user_id: int
    key_id: int | None
    price_micro: int
    period_days: int
    status: str
    renew: bool
    period_start: datetime
    period_end: datetime
    ended_at: datetime | None
    end_reason: str | None

    def live(self, now: datetime) -> bool:
        """Whether it covers use of the agent at ``now``."""
        return self.status == "active" and self.period_start <= now < self.period_end

    def public(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "agentSlug": self.agent_slug, "status": self.status, "renew": self.renew,
            "priceFlow": format_flow(self.price_micro), "periodDays": self.period_days,
            "periodStart": iso(self.period_start), "periodEnd": iso(self.period_end)}
        if self.ended_at is not None:
            body.update(endedAt=iso(self.ended_at), endReason=self.end_reason)
        return body


def _subscription(row: Any) -> Subscription:
    return Subscription(
        id=int(row.id), agent_id=int(row.agent_id), agent_slug=row.slug,
        user_id=int(row.user_id), key_id=row.key_id, price_micro=int(row.price_micro),
        period_days=int(row.period_days), status=row.status, renew=bool(row.renew),
        period_start=as_utc(row.period_start), period_end=as_utc(row.period_end),
        ended_at=as_utc(row.ended_at) if row.ended_at else None, end_reason=row.end_reason)


def _query() -> Select[Any]:
    return select(subscriptions, agents.c.slug).join(
        agents, agents.c.id == subscriptions.c.agent_id)


def find_subscription(connection: Connection, agent_id: int, user_id: int
                      ) -> Subscription | None:
    """The user's subscription to the agent (in any state), or None."""
    row = connection.execute(_query().where(subscriptions.c.agent_id == agent_id)
                             .where(subscriptions.c.user_id == user_id)).first()
    return _subscription(row) if row else None


def user_subscriptions(connection: Connection, user_id: int) -> list[Subscription]:
    """The user's subscriptions, most recently ending first."""
    rows = connection.execute(_query().where(subscriptions.c.user_id == user_id)
                              .order_by(subscriptions.c.period_end.desc()))
    return [_subscription(row) for row in rows]


def check_can_subscribe(agent: Agent, user_id: int, current: Subscription | None,
                        now: datetime) -> bool:
    """Whether a subscribe request must buy a new period (True) or only resume renewal.

    :raises Conflict: the agent is not sold by subscription, is the caller's own, or the
        caller already has a subscription that renews.
    """
    if not agent.monetization.needs_subscription:
        raise Conflict(f"agent {agent.slug!r} is not sold by subscription "
                       f"(its model is {agent.monetization.model})")
    if agent.owner_id == user_id:
        raise Conflict("owners use their own agents without a subscription")
    if current is not None and current.live(now):
        if current.renew:
            raise Conflict(f"already subscribed to {agent.slug!r} until "
                           f"{iso(current.period_end)}")
        return False
    return True


def start_period(connection: Connection, agent: Agent, user_id: int, key_id: int,
                 now: datetime) -> Subscription:
    """Record a paid period from ``now`` and credit the owner (after the key was charged)."""
    price, days = agent.monetization.price_micro, agent.monetization.period_days
    values = {"key_id": key_id, "price_micro": price, "period_days": days, "status": "active",
              "renew": True, "period_start": now, "period_end": now + timedelta(days=days),
              "ended_at": None, "end_reason": None}
    current = find_subscription(connection, agent.id, user_id)
    if current is None:
        subscription_id = connection.execute(insert(subscriptions).values(
            agent_id=agent.id, user_id=user_id, created_at=now, **values)
        ).inserted_primary_key[0]  # type: ignore[index]
    else:
        subscription_id = current.id
        connection.execute(update(subscriptions).where(subscriptions.c.id == current.id)
                           .values(**values))
    credit(connection, Earning(agent_id=agent.id, owner_id=agent.owner_id, payer_id=user_id,
                               key_id=key_id, kind="subscription", amount_micro=price,
                               subscription_id=int(subscription_id)))
    found = find_subscription(connection, agent.id, user_id)
    assert found is not None
    return found


def set_renewal(connection: Connection, agent_id: int, user_id: int, renew: bool,
                now: datetime) -> Subscription:
    """Turn renewal on or off for a subscription in its period.

    :raises NotFound: the user has no subscription to the agent in its period.
    """
    current = find_subscription(connection, agent_id, user_id)
    if current is None or not current.live(now):
        raise NotFound("no subscription to this agent in its period")
    connection.execute(update(subscriptions).where(subscriptions.c.id == current.id)
                       .values(renew=renew))
    found = find_subscription(connection, agent_id, user_id)
    assert found is not None
    return found


def _due(connection: Connection, now: datetime) -> list[Subscription]:
    rows = connection.execute(_query().where(subscriptions.c.status == "active")
                              .where(subscriptions.c.period_end <= now)
                              .order_by(subscriptions.c.period_end).limit(SETTLE_BATCH))
    return [_subscription(row) for row in rows]


def _end(connection: Connection, subscription: Subscription, reason: str) -> None:
    connection.execute(update(subscriptions).where(subscriptions.c.id == subscription.id)
                       .where(subscriptions.c.period_end == subscription.period_end)
                       .values(status="ended", ended_at=subscription.period_end,
                               end_reason=reason))


def _renew(connection: Connection, *, subscription: Subscription, agent: Agent) -> None:
    price, days = agent.monetization.price_micro, agent.monetization.period_days
    start = subscription.period_end
    connection.execute(update(subscriptions).where(subscriptions.c.id == subscription.id)
                       .where(subscriptions.c.period_end == subscription.period_end)
                       .values(price_micro=price, period_days=days, period_start=start,
                               period_end=start + timedelta(days=days)))
    credit(connection, Earning(agent_id=agent.id, owner_id=agent.owner_id,
                               payer_id=subscription.user_id, key_id=subscription.key_id,
                               kind="subscription", amount_micro=price,
                               subscription_id=subscription.id))


def _end_reason(subscription: Subscription, agent: Agent | None) -> str | None:
    """Why a due subscription must end rather than renew, or None to renew it."""
    if not subscription.renew:
        return "canceled"
    if agent is None or not agent.published:
        return "agent_unpublished"
    if not agent.monetization.needs_subscription:
        return "model_changed"
    if subscription.key_id is None:
        return "payment_failed"
    return None


async def settle_due(service: Service, now: datetime | None = None) -> dict[str, int]:
    """Renew or end every subscription whose period ended by ``now`` (default: now).

    Runs under the shared lock ``marketplace.subscriptions`` so that one process at a
    time settles; each row is updated only if its period is still the one read.

    :return: how many subscriptions were renewed and ended.
    """
    moment = now or utcnow()
    report = {"renewed": 0, "ended": 0}
    async with service.shared.lock("marketplace.subscriptions", ttl=120.0):
        for subscription in await service.db.read(_due, moment):
            agent = await service.db.read(lambda c, s=subscription: load_agent(c, s.agent_slug))
            reason = _end_reason(subscription, agent)
            if reason is None:
                assert agent is not None and subscription.key_id is not None
                try:
                    await charge_key(
                        service, subscription.key_id, agent.monetization.price_micro,
                        agent.slug, record=partial(_renew, subscription=subscription, agent=agent),
                        token=f"sub:{subscription.id}:{subscription.period_end.isoformat()}")
                except Unavailable:
                    log.warning("renewal of subscription %d postponed: meter unavailable",
                                subscription.id)
                    continue
                except ServiceError as exc:  # spend cap, revoked key
                    log.info("subscription %d not renewed: %s", subscription.id, exc.code)
                    reason = "payment_failed"
                else:
                    report["renewed"] += 1
                    continue
            await service.db.write(_end, subscription, reason)
            report["ended"] += 1
    return report
