"""Settling: attempt answers recorded in their history rows, deliveries moved on.

A settle runs once per batch of answers. Its guard is the claim: an answer whose delivery is no
longer leased to the settling owner (the subscription was deleted, or the lease ran out and
another process took over) moves nothing. The common case, every attempt of the batch a 2xx,
costs two statements on PostgreSQL (the subscriptions' lock, then one statement that moves the
deliveries still ours and fills in every history row from arrays) and three on SQLite.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Connection,
    DateTime,
    Integer,
    String,
    Text,
    Update,
    bindparam,
    case,
    cast,
    column,
    func,
    literal,
    select,
    update,
)

from plugins.webhooks.outbox import Outcome, Settled
from plugins.webhooks.subscriptions import record_last_error
from plugins.webhooks.tables import (
    DELIVERED,
    FAILED,
    PENDING,
    UNKNOWN,
    attempts,
    deliveries,
    subscriptions,
)
from runtime.wire import utcnow


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


# The history columns an answer fills in, the bind names of ``_answer``, with their types.
_ANSWER_COLUMNS = (("b_delivery", BigInteger()), ("b_number", Integer()),
                   ("b_started", DateTime(timezone=True)), ("b_duration", Integer()),
                   ("b_status", Integer()), ("b_error", Text()), ("b_outcome", String()),
                   ("b_excerpt", Text()))


def _fill_from_arrays(answers: list[dict[str, object]]) -> tuple[Update, dict[str, object]]:
    """PostgreSQL: one ``UPDATE … FROM unnest(…)`` of the history rows and its parameters:
    one array per column, so the statement's text is the same whatever the batch's size
    (compiled once, planned once) and the cost is one statement, not one per row.
    """
    answered = func.unnest(*(cast(bindparam(name, type_=ARRAY(kind)), ARRAY(kind))
                             for name, kind in _ANSWER_COLUMNS)).table_valued(
        *(column(name, kind) for name, kind in _ANSWER_COLUMNS)).render_derived(
        name="answered")
    statement = update(attempts).where(
        attempts.c.delivery_id == answered.c.b_delivery,
        attempts.c.number == answered.c.b_number).values(
        started_at=answered.c.b_started, duration_ms=answered.c.b_duration,
        status_code=answered.c.b_status, error=answered.c.b_error,
        outcome=answered.c.b_outcome, response_excerpt=answered.c.b_excerpt)
    return statement, {name: [answer[name] for answer in answers] for name, _ in _ANSWER_COLUMNS}


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
    fill, parameters = _fill_from_arrays([_answer(outcome, DELIVERED) for outcome in outcomes])
    rows = connection.execute(fill.values(outcome=case(
        (attempts.c.delivery_id.in_(select(done.c.id)), literal(DELIVERED)),
        else_=literal(UNKNOWN))).returning(attempts.c.delivery_id, attempts.c.outcome),
        parameters)
    delivered = {row.delivery_id for row in rows if row.outcome == DELIVERED}
    return ["delivered" if outcome.job.delivery_id in delivered else "stale"
            for outcome in outcomes]


def _record_answers(connection: Connection, answers: list[dict[str, object]]) -> None:
    """Fill in the history rows of a settled batch: on PostgreSQL one statement
    (``_fill_from_arrays``). SQLite's executemany steps one prepared statement in process,
    which costs little per row, and its ``UPDATE … FROM`` takes no ``VALUES`` list with named
    columns.
    """
    if not answers:
        return
    if connection.dialect.name == "postgresql":
        connection.execute(*_fill_from_arrays(answers))
        return
    connection.execute(update(attempts).where(
        attempts.c.delivery_id == bindparam("b_delivery"),
        attempts.c.number == bindparam("b_number")).values(
        started_at=bindparam("b_started"), duration_ms=bindparam("b_duration"),
        status_code=bindparam("b_status"), error=bindparam("b_error"),
        outcome=bindparam("b_outcome"), response_excerpt=bindparam("b_excerpt")), answers)
