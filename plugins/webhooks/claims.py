"""Claims: due deliveries leased to one dispatcher, each attempt started in the history.

On PostgreSQL the candidate rows are read ``FOR UPDATE SKIP LOCKED``, so concurrent
dispatchers in other processes skip them instead of waiting, and the lease (``claimed_until``)
makes a crashed process's claims come back; SQLite has no row locks, but every write
transaction there is ``BEGIN IMMEDIATE`` (one writer at a time), which makes the same
select-then-update atomic. A claim runs once per batch, never once per delivery: a pass is two
statements on PostgreSQL (the candidates, then one data-modifying CTE that leases, starts the
history and returns the jobs) and four on SQLite, whatever its size.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta

from sqlalchemy import (
    CTE,
    ColumnElement,
    Connection,
    Table,
    and_,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
)

from plugins.webhooks.outbox import Claim, Job
from plugins.webhooks.subscriptions import signing_secrets
from plugins.webhooks.tables import PENDING, UNKNOWN, attempts, deliveries, events, subscriptions
from runtime.wire import as_utc, utcnow


def _claimable(now: datetime, owner: str) -> ColumnElement[bool]:
    """Pending, due rows no dispatcher holds: never leased, released, or leased by another
    owner whose lease ran out. ``owner``'s own rows are never taken back by expiry: a running
    dispatcher still holds what it claimed (an outcome waiting out a database outage, say),
    and a restarted one gives its leases back first (``release_claims``)."""
    return and_(deliveries.c.state == PENDING,
                or_(deliveries.c.claimed_until.is_(None),
                    and_(deliveries.c.claimed_until < now, deliveries.c.claim_owner != owner)))


def claim_due(connection: Connection, *, owner: str, lease_seconds: float, room: int,
              host_room: Mapping[str, int], per_host: int) -> Claim:
    """Lease up to ``room`` due deliveries to ``owner``, at most ``host_room[host]`` (or
    ``per_host`` for a host not in the map) per target host, and start an attempt of each
    in the history (outcome ``unknown`` until settled).

    Rows are taken in due order; hosts with no room left are skipped in the query itself, so a
    backlog for one slow host does not hide the other hosts' due deliveries. ``exhausted``: no
    other due delivery could be claimed now (with more room); ``next_due`` is only looked up
    then (otherwise the caller claims again as soon as it has room).
    """
    now = utcnow()
    claimable = _claimable(now, owner)
    picked: list[int] = []
    jobs: list[Job] = []
    left = dict(host_room)
    exhausted = False
    due_left: datetime | None = None
    # A pass that fills a host leaves that host's other rows among its candidates: the next
    # pass skips the hosts now full, so other hosts' due rows further down are found too, in
    # the same transaction. Each pass claims something or adds a full host: it ends.
    while len(picked) < room and not exhausted:
        full = [host for host, remaining in left.items() if remaining <= 0]
        # No host takes more than ``per_host`` (a host already held has less room): more
        # candidates than twice that would be read only to be skipped.
        limit = min(room - len(picked), per_host) * 2
        query = (select(deliveries.c.id, subscriptions.c.host)
                 .join(subscriptions, subscriptions.c.id == deliveries.c.subscription_id)
                 .where(claimable, deliveries.c.next_attempt_at <= now)
                 .order_by(deliveries.c.next_attempt_at).limit(limit)
                 .with_for_update(skip_locked=True, of=deliveries))
        if full:
            query = query.where(subscriptions.c.host.not_in(full))
        candidates = connection.execute(query).all()
        exhausted = len(candidates) < limit
        fresh: list[int] = []
        for candidate in candidates:
            if len(picked) + len(fresh) == room:
                break
            if left.setdefault(candidate.host, per_host) > 0:
                left[candidate.host] -= 1
                fresh.append(candidate.id)
            else:
                due_left = now  # a due row this claim had no room for
        if fresh:  # claimed now, so the next pass no longer sees them
            jobs += _lease(connection, fresh, now=now, owner=owner,
                           until=now + timedelta(seconds=lease_seconds))
            picked += fresh
    next_due = due_left
    if exhausted and next_due is None:
        next_due = connection.execute(
            select(func.min(deliveries.c.next_attempt_at)).where(claimable)
        ).scalar_one_or_none()
    return Claim(jobs=jobs, next_due=as_utc(next_due) if next_due else None,
                 exhausted=exhausted)


def _lease(connection: Connection, ids: list[int], *, now: datetime, owner: str,
           until: datetime) -> list[Job]:
    """Lease the deliveries ``ids`` to ``owner`` until ``until``, count the attempt, start its
    history row (outcome ``unknown``) and return what to send, in due order.

    On PostgreSQL one statement (a data-modifying CTE: the update, the history insert fed by
    its ``RETURNING``, and the join that reads the jobs): the cost there is per statement.
    SQLite runs the three in turn, inside the same ``BEGIN IMMEDIATE`` transaction.
    """
    lease = update(deliveries).where(deliveries.c.id.in_(ids)).values(
        claimed_until=until, claim_owner=owner, attempts=deliveries.c.attempts + 1)
    history_columns = ["delivery_id", "number", "started_at", "duration_ms", "status_code",
                       "error", "outcome"]
    started = (literal(now, attempts.c.started_at.type), literal(0), null(), null(),
               literal(UNKNOWN))
    claimed: CTE | Table
    history: CTE | None = None
    if connection.dialect.name == "postgresql":
        claimed = lease.returning(deliveries.c.id, deliveries.c.attempts,
                                  deliveries.c.event_id, deliveries.c.subscription_id,
                                  deliveries.c.next_attempt_at).cte("claimed")
        history = insert(attempts).from_select(
            history_columns, select(claimed.c.id, claimed.c.attempts, *started)).cte("history")
    else:
        claimed = deliveries
        connection.execute(lease)
        connection.execute(insert(attempts).from_select(
            history_columns,
            select(deliveries.c.id, deliveries.c.attempts, *started)
            .where(deliveries.c.id.in_(ids))))
    query = (select(claimed.c.id, claimed.c.attempts, claimed.c.event_id,
                    claimed.c.subscription_id, subscriptions.c.url, subscriptions.c.host,
                    subscriptions.c.secret, subscriptions.c.previous_secret,
                    subscriptions.c.previous_secret_until, events.c.body)
             .join_from(claimed, subscriptions, subscriptions.c.id == claimed.c.subscription_id)
             .join(events, events.c.id == claimed.c.event_id)
             .order_by(claimed.c.next_attempt_at))
    # A CTE that the query does not read is still run by PostgreSQL, once, with the others.
    rows = connection.execute(query.add_cte(history) if history is not None
                              else query.where(deliveries.c.id.in_(ids)))
    return [Job(delivery_id=row.id, number=row.attempts, event_id=row.event_id,
                subscription_id=row.subscription_id, url=row.url, host=row.host,
                body=bytes(row.body),
                secrets=signing_secrets(row.secret, row.previous_secret,
                                        row.previous_secret_until, now))
            for row in rows]
