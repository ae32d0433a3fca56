"""The transactional outbox: events written with their cause, claimed and settled by dispatchers.

``fan_out`` runs inside the emitter's transaction (the ``flowsvc_event_emitted`` hook), so a
delivery exists if and only if the change that caused it committed. ``claim_due`` leases due
deliveries to one dispatcher: on PostgreSQL the candidate rows are read ``FOR UPDATE SKIP
LOCKED``, so concurrent dispatchers in other processes skip them instead of waiting, and the
lease (``claimed_until``) makes a crashed process's claims come back; SQLite has no row locks,
but every write transaction there is ``BEGIN IMMEDIATE`` (one writer at a time), which makes
the same select-then-update atomic. ``settle`` records attempt outcomes, guarded by the claim,
so a dispatcher whose lease was taken over cannot overwrite the new owner's work.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import Connection, delete, exists, func, insert, or_, select, update

from plugins.webhooks.signing import envelope_body
from plugins.webhooks.subscriptions import list_subscriptions, record_last_error, signing_secrets
from plugins.webhooks.tables import (
    DELIVERED,
    FAILED,
    PENDING,
    attempts,
    deliveries,
    events,
    subscriptions,
)
from runtime.events import OutboundEvent
from runtime.wire import as_utc, utcnow

Settled = Literal["delivered", "retry", "failed", "stale"]
PURGE_BATCH = 1000


@dataclass(frozen=True)
class Job:
    """One claimed delivery attempt: what to send, where, signed with which secrets."""

    delivery_id: int
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


def claim_due(connection: Connection, *, owner: str, lease_seconds: float, room: int,
              host_room: Mapping[str, int], per_host: int) -> Claim:
    """Lease up to ``room`` due deliveries to ``owner``, at most ``host_room[host]`` (or
    ``per_host`` for a host not in the map) per target host.

    Rows are taken in due order; hosts with no room left are skipped in the query itself, so a
    backlog for one slow host does not hide the other hosts' due deliveries.
    """
    now = utcnow()
    full = [host for host, left in host_room.items() if left <= 0]
    limit = room * 2
    query = (select(deliveries.c.id, subscriptions.c.host)
             .join(subscriptions, subscriptions.c.id == deliveries.c.subscription_id)
             .where(deliveries.c.state == PENDING, deliveries.c.next_attempt_at <= now,
                    or_(deliveries.c.claimed_until.is_(None), deliveries.c.claimed_until < now))
             .order_by(deliveries.c.next_attempt_at).limit(limit)
             .with_for_update(skip_locked=True, of=deliveries))
    if full:
        query = query.where(subscriptions.c.host.not_in(full))
    candidates = connection.execute(query).all()
    picked: list[int] = []
    left = dict(host_room)
    for candidate in candidates:
        if len(picked) == room:
            break
        if left.setdefault(candidate.host, per_host) > 0:
            left[candidate.host] -= 1
            picked.append(candidate.id)
    jobs: list[Job] = []
    if picked:
        connection.execute(update(deliveries).where(deliveries.c.id.in_(picked)).values(
            claimed_until=now + timedelta(seconds=lease_seconds), claim_owner=owner))
        rows = connection.execute(
            select(deliveries.c.id, deliveries.c.event_id, deliveries.c.subscription_id,
                   subscriptions.c.url, subscriptions.c.host, subscriptions.c.secret,
                   subscriptions.c.previous_secret, subscriptions.c.previous_secret_until,
                   events.c.body)
            .join(subscriptions, subscriptions.c.id == deliveries.c.subscription_id)
            .join(events, events.c.id == deliveries.c.event_id)
            .where(deliveries.c.id.in_(picked)).order_by(deliveries.c.next_attempt_at))
        jobs = [Job(delivery_id=row.id, event_id=row.event_id,
                    subscription_id=row.subscription_id, url=row.url, host=row.host,
                    body=bytes(row.body),
                    secrets=signing_secrets(row.secret, row.previous_secret,
                                            row.previous_secret_until, now))
                for row in rows]
    next_due = connection.execute(
        select(func.min(deliveries.c.next_attempt_at)).where(
            deliveries.c.state == PENDING,
            or_(deliveries.c.claimed_until.is_(None), deliveries.c.claimed_until < now))
    ).scalar_one_or_none()
    return Claim(jobs=jobs, next_due=as_utc(next_due) if next_due else None,
                 exhausted=len(candidates) < limit)


def settle(connection: Connection, outcomes: Sequence[Outcome], *, owner: str,
           max_retries: int, retry_delay: Callable[[int], float]) -> list[Settled]:
    """Record each attempt and move its delivery on: delivered, due again after
    ``retry_delay(n)`` seconds (``n`` counting retries from 0), or failed for good, which
    stores ``last_error`` on the subscription. An outcome whose claim is no longer ``owner``'s
    (the subscription was deleted, or the lease expired and another process took over) is
    ignored and reported as ``stale``.

    The common case, delivered, costs three statements for the whole batch.
    """
    now = utcnow()
    # A subscription deleted meanwhile (its deliveries go by cascade) must either wait for this
    # transaction or be gone from the read below, never vanish before the inserts. Locks are
    # taken in the order a delete takes them, subscriptions (by id) then deliveries, so the two
    # cannot deadlock; ``FOR NO KEY UPDATE`` does not block emitters' ``FOR KEY SHARE``.
    connection.execute(select(subscriptions.c.id).where(
        subscriptions.c.id.in_({outcome.job.subscription_id for outcome in outcomes}))
        .order_by(subscriptions.c.id).with_for_update(key_share=True))
    claimed = {row.id: row for row in connection.execute(
        select(deliveries.c.id, deliveries.c.attempts, deliveries.c.retries_left).where(
            deliveries.c.id.in_([outcome.job.delivery_id for outcome in outcomes]),
            deliveries.c.state == PENDING, deliveries.c.claim_owner == owner)
        .with_for_update())}
    released = {"claimed_until": None, "claim_owner": None}
    results: list[Settled] = []
    delivered: list[int] = []
    tried: list[dict[str, object]] = []
    for outcome in outcomes:
        job = outcome.job
        row = claimed.get(job.delivery_id)
        if row is None:
            results.append("stale")
            continue
        number = row.attempts + 1
        settled: Settled
        if outcome.error is None:
            settled = "delivered"
            delivered.append(job.delivery_id)
        elif outcome.permanent or row.retries_left <= 0:
            settled = "failed"
            connection.execute(update(deliveries).where(deliveries.c.id == job.delivery_id)
                               .values(state=FAILED, attempts=number, next_attempt_at=None,
                                       finished_at=now, **released))
            record_last_error(connection, job.subscription_id,
                              f"{outcome.error} (event {job.event_id}, attempt {number})", now)
        else:
            settled = "retry"
            # Retry n of the schedule (from 0) waits about base * 2**n.
            due = now + timedelta(seconds=retry_delay(max(0, max_retries - row.retries_left)))
            connection.execute(update(deliveries).where(deliveries.c.id == job.delivery_id)
                               .values(attempts=number, retries_left=row.retries_left - 1,
                                       next_attempt_at=due, **released))
        tried.append({"delivery_id": job.delivery_id, "number": number,
                      "started_at": outcome.started_at, "duration_ms": outcome.duration_ms,
                      "status_code": outcome.status_code, "error": outcome.error,
                      "outcome": settled})
        results.append(settled)
    if delivered:
        connection.execute(update(deliveries).where(deliveries.c.id.in_(delivered)).values(
            state=DELIVERED, attempts=deliveries.c.attempts + 1, next_attempt_at=None,
            finished_at=now, **released))
    if tried:
        connection.execute(insert(attempts), tried)
    return results


def release_claims(connection: Connection, owner: str) -> int:
    """Give back every lease ``owner`` holds (a dispatcher stopping or restarting)."""
    return connection.execute(update(deliveries).where(
        deliveries.c.claim_owner == owner, deliveries.c.state == PENDING).values(
        claimed_until=None, claim_owner=None)).rowcount


def purge_finished(connection: Connection, older_than: datetime) -> int:
    """Delete up to ``PURGE_BATCH`` events older than ``older_than`` with nothing pending;
    their deliveries and attempts go with them. Returns how many events were deleted."""
    pending = exists().where(deliveries.c.event_id == events.c.id, deliveries.c.state == PENDING)
    ids = connection.execute(select(events.c.id).where(events.c.created_at < older_than, ~pending)
                             .limit(PURGE_BATCH)).scalars().all()
    if ids:
        connection.execute(delete(events).where(events.c.id.in_(ids)))
    return len(ids)
