"""The transactional outbox: events written with their cause, claimed and settled by dispatchers.

``fan_out`` runs inside the emitter's transaction (the ``flowsvc_event_emitted`` hook), so a
delivery exists if and only if the change that caused it committed. ``claim_due`` leases due
deliveries to one dispatcher: on PostgreSQL the candidate rows are read ``FOR UPDATE SKIP
LOCKED``, so concurrent dispatchers in other processes skip them instead of waiting, and the
lease (``claimed_until``) makes a crashed process's claims come back; SQLite has no row locks,
but every write transaction there is ``BEGIN IMMEDIATE`` (one writer at a time), which makes
the same select-then-update atomic. ``settle`` records attempt outcomes, guarded by the claim,
so a dispatcher whose lease was taken over cannot overwrite the new owner's work.

Every attempt is in the history from the moment it is claimed: the claim writes its row with
the outcome ``unknown`` (and counts it in ``deliveries.attempts``), and settling fills in the
answer. An attempt whose process died on the way (even ``kill -9`` after the receiver got the
request) therefore stays in the history as ``unknown`` instead of vanishing. Both run once per
batch of deliveries, never once per delivery: a claim pass is two statements on PostgreSQL
(the candidates, then one data-modifying CTE that leases, starts the history and returns the
jobs) and four on SQLite, whatever its size; a settle three when every attempt got a 2xx.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import (
    CTE,
    BigInteger,
    ColumnElement,
    Connection,
    DateTime,
    Integer,
    String,
    Table,
    Text,
    Update,
    and_,
    bindparam,
    case,
    cast,
    column,
    delete,
    exists,
    func,
    insert,
    literal,
    null,
    or_,
    select,
    update,
    values,
)

from plugins.webhooks.signing import envelope_body
from plugins.webhooks.subscriptions import list_subscriptions, record_last_error, signing_secrets
from plugins.webhooks.tables import (
    DELIVERED,
    FAILED,
    PENDING,
    UNKNOWN,
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
        limit = (room - len(picked)) * 2
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


def settle(connection: Connection, outcomes: Sequence[Outcome], *, owner: str,
           max_retries: int, retry_delay: Callable[[int], float]) -> list[Settled]:
    """Record each attempt's answer in its history row and move its delivery on: delivered,
    due again after ``retry_delay(n)`` seconds (``n`` counting retries from 0), or failed for
    good, which stores ``last_error`` on the subscription. An outcome whose claim is no longer
    ``owner``'s (the subscription was deleted, or the lease expired and another process took
    over) moves nothing and is reported as ``stale``; its answer is still recorded, with the
    outcome left ``unknown`` (it did not decide what happened to the delivery).

    The common case, every attempt of the batch delivered, costs three statements: the
    subscriptions' lock, the deliveries' update (which also says which are still ``owner``'s)
    and the attempts' one (``_record_answers``).
    """
    now = utcnow()
    released = {"claimed_until": None, "claim_owner": None}
    failures = [outcome for outcome in outcomes if outcome.error is not None]
    # A delete of a subscription (cascading to its deliveries) may run meanwhile: locks are
    # taken in the order a delete takes them, subscriptions (by id) then deliveries, so the two
    # cannot deadlock over a batch's rows; ``FOR NO KEY UPDATE`` does not block emitters'
    # ``FOR KEY SHARE``.
    connection.execute(select(subscriptions.c.id).where(
        subscriptions.c.id.in_({outcome.job.subscription_id for outcome in outcomes}))
        .order_by(subscriptions.c.id).with_for_update(key_share=True))
    ours = (deliveries.c.state == PENDING, deliveries.c.claim_owner == owner)
    if not failures and connection.dialect.name == "postgresql":
        return _settle_delivered(connection, outcomes, owner=owner, now=now)
    delivered = {outcome.job.delivery_id for outcome in outcomes if outcome.error is None}
    if delivered:
        delivered = set(connection.execute(
            update(deliveries).where(deliveries.c.id.in_(delivered), *ours)
            .values(state=DELIVERED, next_attempt_at=None, finished_at=now, **released)
            .returning(deliveries.c.id)).scalars())
    claimed = {row.id: row for row in connection.execute(
        select(deliveries.c.id, deliveries.c.retries_left).where(
            deliveries.c.id.in_([outcome.job.delivery_id for outcome in failures]), *ours)
        .with_for_update())} if failures else {}
    results: list[Settled] = []
    answers: list[dict[str, object]] = []
    for outcome in outcomes:
        job = outcome.job
        row = claimed.get(job.delivery_id)
        settled: Settled
        if outcome.error is None:
            settled = "delivered" if job.delivery_id in delivered else "stale"
        elif row is None:
            settled = "stale"
        elif outcome.permanent or row.retries_left <= 0:
            settled = "failed"
            connection.execute(update(deliveries).where(deliveries.c.id == job.delivery_id)
                               .values(state=FAILED, next_attempt_at=None, finished_at=now,
                                       **released))
            record_last_error(connection, job.subscription_id,
                              f"{outcome.error} (event {job.event_id}, attempt {job.number})",
                              now)
        else:
            settled = "retry"
            # Retry n of the schedule (from 0) waits about base * 2**n.
            due = now + timedelta(seconds=retry_delay(max(0, max_retries - row.retries_left)))
            connection.execute(update(deliveries).where(deliveries.c.id == job.delivery_id)
                               .values(retries_left=row.retries_left - 1,
                                       next_attempt_at=due, **released))
        answers.append(_answer(outcome, UNKNOWN if settled == "stale" else settled))
        results.append(settled)
    _record_answers(connection, answers)
    return results


def _answer(outcome: Outcome, settled: str) -> dict[str, object]:
    """The bind values that fill in ``outcome``'s history row, ``settled`` its outcome."""
    job = outcome.job
    return {"b_delivery": job.delivery_id, "b_number": job.number,
            "b_started": outcome.started_at, "b_duration": outcome.duration_ms,
            "b_status": outcome.status_code, "b_error": outcome.error,
            "b_excerpt": outcome.response_excerpt, "b_outcome": settled}


def _fill_from_values(answers: list[dict[str, object]]) -> Update:
    """PostgreSQL: one ``UPDATE … FROM (VALUES …)`` of the history rows, whatever the batch's
    size (the cost there is per statement; an executemany runs one per row, even pipelined).
    """
    # Columns read off ``values()`` before ``.data()`` would name the empty VALUES in the FROM
    # clause, hence the names listed here. A None is rendered as a bare NULL, typed text when
    # a whole column is NULL: the nullable ones are cast back.
    names = ("b_delivery", "b_number", "b_started", "b_duration", "b_status", "b_error",
             "b_outcome", "b_excerpt")
    answered = values(
        column("b_delivery", BigInteger), column("b_number", Integer),
        column("b_started", DateTime(timezone=True)), column("b_duration", Integer),
        column("b_status", Integer), column("b_error", Text), column("b_outcome", String),
        column("b_excerpt", Text), name="answered",
    ).data([tuple(answer[name] for name in names) for answer in answers])
    return update(attempts).where(
        attempts.c.delivery_id == answered.c.b_delivery,
        attempts.c.number == answered.c.b_number).values(
        started_at=answered.c.b_started, duration_ms=answered.c.b_duration,
        status_code=cast(answered.c.b_status, Integer),
        error=cast(answered.c.b_error, Text), outcome=answered.c.b_outcome,
        response_excerpt=cast(answered.c.b_excerpt, Text))


def _settle_delivered(connection: Connection, outcomes: Sequence[Outcome], *, owner: str,
                      now: datetime) -> list[Settled]:
    """PostgreSQL, every attempt of the batch a 2xx (subscriptions already locked): one
    statement, the deliveries' update (a CTE saying which are still ``owner``'s) feeding the
    history rows' one; an attempt whose claim is no longer ``owner``'s keeps ``unknown``."""
    done = (update(deliveries).where(
        deliveries.c.id.in_({outcome.job.delivery_id for outcome in outcomes}),
        deliveries.c.state == PENDING, deliveries.c.claim_owner == owner)
        .values(state=DELIVERED, next_attempt_at=None, finished_at=now, claimed_until=None,
                claim_owner=None)
        .returning(deliveries.c.id).cte("done"))
    fill = _fill_from_values([_answer(outcome, DELIVERED) for outcome in outcomes])
    rows = connection.execute(fill.values(outcome=case(
        (attempts.c.delivery_id.in_(select(done.c.id)), literal(DELIVERED)),
        else_=literal(UNKNOWN))).returning(attempts.c.delivery_id, attempts.c.outcome))
    delivered = {row.delivery_id for row in rows if row.outcome == DELIVERED}
    return ["delivered" if outcome.job.delivery_id in delivered else "stale"
            for outcome in outcomes]


def _record_answers(connection: Connection, answers: list[dict[str, object]]) -> None:
    """Fill in the history rows of a settled batch: on PostgreSQL one statement
    (``_fill_from_values``). SQLite's executemany steps one prepared statement in process,
    which costs little per row, and its ``UPDATE … FROM`` takes no ``VALUES`` list with named
    columns.
    """
    if not answers:
        return
    if connection.dialect.name == "postgresql":
        connection.execute(_fill_from_values(answers))
        return
    connection.execute(update(attempts).where(
        attempts.c.delivery_id == bindparam("b_delivery"),
        attempts.c.number == bindparam("b_number")).values(
        started_at=bindparam("b_started"), duration_ms=bindparam("b_duration"),
        status_code=bindparam("b_status"), error=bindparam("b_error"),
        outcome=bindparam("b_outcome"), response_excerpt=bindparam("b_excerpt")), answers)


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
