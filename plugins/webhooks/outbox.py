"""The transactional outbox: events written with their cause, and the records dispatchers
pass around while they claim (``claims``), send (``sender``) and settle (``settling``) them.

``fan_out`` runs inside the emitter's transaction (the ``flowsvc_event_emitted`` hook), so a
delivery exists if and only if the change that caused it committed. A claim leases due
deliveries to one dispatcher (``claim_owner``, ``claimed_until``) and starts each attempt's
row in the history (outcome ``unknown``); settling fills in the answer, guarded by the claim,
so a dispatcher whose lease was taken over cannot overwrite the new owner's work. An attempt
whose process died on the way (even ``kill -9`` after the receiver got the request) therefore
stays in the history as ``unknown`` instead of vanishing.

A dispatcher claims ahead of its free slots; what it claimed but never started (it stopped
first, or the lease would run out before the attempt could end) is handed back with
``give_back``, which also takes the never-made attempt out of the history.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from sqlalchemy import Connection, delete, exists, insert, select, tuple_, update

from plugins.webhooks.signing import envelope_body
from plugins.webhooks.subscriptions import list_subscriptions
from plugins.webhooks.tables import PENDING, UNKNOWN, attempts, deliveries, events
from runtime.events import OutboundEvent

Settled = Literal["delivered", "retry", "failed", "stale"]
PURGE_BATCH = 1000


@dataclass(frozen=True)
class Job:
    """One claimed delivery attempt: what to send, where, signed with which secrets.

    :param number: the attempt's number (from 1), which names its row in the history.
    """

    delivery_id: int
    number: int
    event_id: str
    subscription_id: int
    url: str
    host: str
    body: bytes
    secrets: list[str]


@dataclass(frozen=True)
class Claim:
    """What ``claim_due`` leased, when the next unclaimed delivery falls due, and whether
    more due rows may be waiting beyond this batch."""

    jobs: list[Job]
    next_due: datetime | None
    exhausted: bool


@dataclass(frozen=True)
class Outcome:
    """The result of one attempt; ``error`` is None when it was delivered (a 2xx).

    :param permanent: no retry can succeed (the URL is refused by the SSRF policy now).
    """

    job: Job
    started_at: datetime
    duration_ms: int
    status_code: int | None
    error: str | None
    permanent: bool = False
    response_excerpt: str | None = None


def write_event(connection: Connection, event: OutboundEvent, subscription_ids: Sequence[int],
                retries: int) -> None:
    """Store ``event`` once and one pending delivery of it per subscription, due now.

    :raises ValueError, TypeError: the payload cannot be sent faithfully (see ``envelope_body``).
    """
    body = envelope_body(event.id, event.name, event.user_id, event.created_at, event.data)
    connection.execute(insert(events).values(id=event.id, user_id=event.user_id, name=event.name,
                                             created_at=event.created_at, body=body))
    connection.execute(insert(deliveries), [
        {"event_id": event.id, "subscription_id": subscription_id, "state": PENDING,
         "attempts": 0, "retries_left": retries, "next_attempt_at": event.created_at,
         "created_at": event.created_at}
        for subscription_id in subscription_ids])


def fan_out(connection: Connection, event: OutboundEvent, retries: int) -> int:
    """Queue ``event`` for every subscription of its user that wants it; return how many."""
    # Locked: a subscription being deleted concurrently makes this wait, or is not read, so
    # the emitter's transaction never fails on a foreign key because of a webhook change.
    wanted = [subscription.id
              for subscription in list_subscriptions(connection, event.user_id, lock=True)
              if subscription.wants(event.name)]
    if wanted:
        write_event(connection, event, wanted, retries)
    return len(wanted)


def release_claims(connection: Connection, owner: str) -> int:
    """Give back every lease ``owner`` holds (a dispatcher stopping or restarting)."""
    return connection.execute(update(deliveries).where(
        deliveries.c.claim_owner == owner, deliveries.c.state == PENDING).values(
        claimed_until=None, claim_owner=None)).rowcount


def give_back(connection: Connection, jobs: Sequence[Job], owner: str) -> int:
    """Hand back claims of ``owner`` that were never sent: release the lease, uncount the
    attempt and delete its ``unknown`` row, so the history shows only attempts made. A claim
    ``owner`` no longer holds (its lease ran out and another took it) is left alone."""
    if not jobs:
        return 0
    number = {job.delivery_id: job.number for job in jobs}
    still_ours = connection.execute(update(deliveries).where(
        deliveries.c.id.in_(number), deliveries.c.claim_owner == owner,
        deliveries.c.state == PENDING).values(
        claimed_until=None, claim_owner=None, attempts=deliveries.c.attempts - 1)
        .returning(deliveries.c.id)).scalars().all()
    if still_ours:
        connection.execute(delete(attempts).where(
            tuple_(attempts.c.delivery_id, attempts.c.number).in_(
                [(delivery_id, number[delivery_id]) for delivery_id in still_ours]),
            attempts.c.outcome == UNKNOWN))
    return len(still_ours)


def purge_finished(connection: Connection, older_than: datetime) -> int:
    """Delete up to ``PURGE_BATCH`` events older than ``older_than`` with nothing pending;
    their deliveries and attempts go with them. Returns how many events were deleted."""
    pending = exists().where(deliveries.c.event_id == events.c.id, deliveries.c.state == PENDING)
    ids = connection.execute(select(events.c.id).where(events.c.created_at < older_than, ~pending)
                             .limit(PURGE_BATCH)).scalars().all()
    if ids:
        connection.execute(delete(events).where(events.c.id.in_(ids)))
    return len(ids)
