"""The charge ledger: a ``Charge`` recorded once per token, and the reconciler.

A charge goes through three steps, in this order:

1. **Open** (one transaction): a ``key_charges`` row ``pending`` for the token (or the
   row already there: ``applied`` answers the first charge again; ``void``, a charge taken
   back before it was recorded, is made ``pending`` again and the meter forgets the void:
   the retry makes the charge anew, once).
2. **Meter** (Redis script, or this process's memory): the spend is applied once per
   token; a retried script (it timed out here but ran in Redis) is a no-op.
3. **Record** (one transaction): the row turns ``applied`` only if still ``pending``, and
   with it the key's usage row, the key's stored spend and the caller's ``record`` (a run's
   charges, the owner's earnings) are written. A retry finds ``applied`` and writes
   nothing.

A crash, a timeout or an outage can leave a row ``pending`` (its meter step perhaps
applied). The caller retries with the same token and finishes it; if nobody does, the
reconciler (``keys.charges``) voids it: it claims the row (``pending`` to ``voiding``, so
a late step 3 cannot record it any more), takes the charge back from the meter (a VOID of
the token, a no-op if it was never applied, and a bar to its being applied later), then
marks it ``void``; a caller that retries later makes the charge anew. A row is left to the
reconciler once it is older than ``charge_grace_seconds``, or, embedded (one process,
memory meter), as soon as it was opened before this process started. Step 3 refused for a
reason other than an outage (the caller's ``record`` raised) voids the charge the same
way, at once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import trio
from sqlalchemy import Connection, select, update
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from plugins.keys.errors import ApiKeyInvalid, ApiKeyRevoked
from plugins.keys.metering import CHARGE, REOPEN, VOID, item_for
from plugins.keys.periods import reset_text_at
from plugins.keys.records import KeyRecord, add_spend
from plugins.keys.state import KeysState
from plugins.keys.tables import key_charges
from plugins.keys.usage import UsageEntry, write_entries
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available
from runtime.contracts.meter import TOKEN_MAX_LENGTH, Charge, Charged, ChargeRecord
from runtime.errors import SpendCapReached, Unavailable, is_outage
from runtime.wire import format_flow, utcnow

log = logging.getLogger("flowsvc.keys")
CHARGES_ACTOR = "keys.charges"
_RECONCILE_BATCH = 200


@dataclass(frozen=True)
class LedgerRow:
    """A ``key_charges`` row as the charge steps need it."""

    token: str
    key_id: int
    amount: int
    state: str
    created_at: datetime


def _row(connection: Connection, token: str) -> LedgerRow | None:
    found = connection.execute(select(key_charges).where(key_charges.c.token == token)).first()
    if found is None:
        return None
    return LedgerRow(found.token, int(found.key_id), int(found.amount), found.state,
                     found.created_at)


def open_charge(connection: Connection, message: Charge, now: datetime) -> LedgerRow:
    """Step 1: the token's row, made ``pending`` when it is new (a retry, or a concurrent
    attempt, finds the row already there)."""
    dialect_insert = postgresql_insert if connection.dialect.name == "postgresql" \
        else sqlite_insert
    connection.execute(dialect_insert(key_charges).values(
        token=message.token, key_id=message.key_id, amount=message.micro_flow,
        model=message.model[:64], state="pending", created_at=now)
        .on_conflict_do_nothing(index_elements=["token"]))
    row = _row(connection, message.token)
    assert row is not None
    return row


def record_charge(connection: Connection, row: LedgerRow, model: str, period_key: int,
                  record: ChargeRecord | None) -> str:
    """Step 3: turn the row ``applied`` with its usage row, stored spend and ``record``.

    :return: the row's state afterwards (``applied``; another when it was taken back).
    """
    claimed = connection.execute(
        update(key_charges).where(key_charges.c.token == row.token,
                                  key_charges.c.state == "pending")
        .values(state="applied", period_key=period_key, settled_at=utcnow())).rowcount
    if claimed == 0:
        current = _row(connection, row.token)
        return "void" if current is None else current.state
    write_entries(connection, [UsageEntry(row.key_id, row.created_at, "charge", None, None,
                                          None, row.amount, model, None)])
    add_spend(connection, {(row.key_id, period_key): row.amount})
    if record is not None:
        record(connection)
    return "applied"


def _set_state(connection: Connection, token: str, before: tuple[str, ...], after: str) -> bool:
    return bool(connection.execute(
        update(key_charges).where(key_charges.c.token == token,
                                  key_charges.c.state.in_(before))
        .values(state=after, settled_at=utcnow())).rowcount)


def reopen_charge(connection: Connection, token: str, now: datetime) -> LedgerRow:
    """Make a ``void`` row ``pending`` again (its charge is made anew); the row as it is."""
    connection.execute(update(key_charges)
                       .where(key_charges.c.token == token, key_charges.c.state == "void")
                       .values(state="pending", created_at=now, settled_at=None))
    row = _row(connection, token)
    assert row is not None
    return row


def _taken_back(token: str) -> Unavailable:
    return Unavailable(f"the charge {token!r} was taken back while it was being made: "
                       "retry it")


def _check_message(message: Charge) -> None:
    if message.micro_flow < 0:
        raise ValueError("Charge.micro_flow must be >= 0")
    if not 1 <= len(message.token) <= TOKEN_MAX_LENGTH:
        raise ValueError(f"Charge.token must be 1 to {TOKEN_MAX_LENGTH} characters")


async def charge(state: KeysState, message: Charge) -> Charged:
    """Handle ``Charge`` (``runtime.contracts.meter`` says what it raises)."""
    _check_message(message)
    record = await state.directory.by_id(message.key_id)
    if record is None:
        raise ApiKeyInvalid(f"API key {message.key_id} does not exist")
    if record.revoked_at is not None and record.revoked_at <= utcnow():  # future: rotating
        raise ApiKeyRevoked(f"API key {message.key_id} was revoked")
    row = await state.db.write(open_charge, message, utcnow())
    if row.state == "void":  # taken back earlier (never recorded): this retry makes it anew
        row = await state.db.write(reopen_charge, message.token, utcnow())
        if row.state == "pending":
            unix = utcnow().timestamp()
            await state.meter.meter(item_for(record, REOPEN, row.amount, 0, unix, row.token),
                                    unix)
    if row.state == "applied":
        return await _answer(state, record, row.amount)
    if row.state != "pending":  # the reconciler is taking it back right now
        raise _taken_back(message.token)
    unix = utcnow().timestamp()
    result = await state.meter.meter(
        item_for(record, CHARGE, row.amount, 0, unix, message.token), unix)
    if result.status == "void":
        raise _taken_back(message.token)
    if result.status == "spend":
        await state.db.write(_set_state, message.token, ("pending",), "void")
        raise SpendCapReached(f"API key {record.prefix} has reached its spend cap of "
                              f"{format_flow(record.spend_limit or 0)} FLOW for this "
                              f"{record.spend_period} period")
    try:
        settled = await state.db.write(record_charge, row, message.model[:64],
                                       result.period_key, message.record)
    except Exception as exc:
        if not is_outage(exc):  # the caller's record was refused: take the charge back
            await until_available(lambda: void_charge(state, record, row),
                                  what=f"voiding charge {row.token}", log=log)
        raise
    if settled != "applied":
        # Voided meanwhile by a reconciler, whose VOID reached a shared meter but not this
        # process's own (embedded): take the spend back here too (a no-op if it is gone).
        await state.meter.meter(item_for(record, VOID, row.amount, 0, unix, row.token), unix)
        raise _taken_back(message.token)
    return Charged(key_id=record.id, micro_flow=row.amount, period_used=result.used,
                   period_limit=record.spend_limit,
                   period_reset=reset_text_at(record.spend_period, unix))


async def _answer(state: KeysState, record: KeyRecord, amount: int) -> Charged:
    """``Charged`` for a token charged before (a retry), with the key's spend now."""
    now = utcnow()
    used = await state.meter.period_used([record], now)
    return Charged(key_id=record.id, micro_flow=amount, period_used=used[record.id],
                   period_limit=record.spend_limit,
                   period_reset=reset_text_at(record.spend_period, now.timestamp()))


async def void_charge(state: KeysState, record: KeyRecord, row: LedgerRow) -> bool:
    """Take back the charge of ``row``: claim it, void its token in the meter, mark it void.

    :return: whether this call claimed it (False: it was applied or voided meanwhile).
    """
    claimed = await state.db.write(_set_state, row.token, ("pending", "voiding"), "voiding")
    if not claimed:
        return False
    unix = utcnow().timestamp()
    item = item_for(record, VOID, row.amount, 0, unix, row.token)
    await state.meter.meter(item, unix)
    await state.db.write(_set_state, row.token, ("voiding",), "void")
    return True


def _stale(connection: Connection, before: datetime) -> list[LedgerRow]:
    rows = connection.execute(
        select(key_charges).where(
            ((key_charges.c.state == "pending") & (key_charges.c.created_at < before))
            | (key_charges.c.state == "voiding"))
        .order_by(key_charges.c.created_at).limit(_RECONCILE_BATCH))
    return [LedgerRow(row.token, int(row.key_id), int(row.amount), row.state, row.created_at)
            for row in rows]


async def reconcile(state: KeysState, before: datetime) -> int:
    """Void every charge left ``pending`` since before ``before`` (and finish any left
    ``voiding``); returns how many it voided."""
    voided = 0
    while True:
        rows = await state.db.read(_stale, before)
        for row in rows:
            record = await state.directory.by_id(row.key_id)
            if record is None:  # keys are revoked, never deleted
                raise RuntimeError(f"charge {row.token} names the missing key {row.key_id}")
            if await void_charge(state, record, row):
                voided += 1
                log.warning("charge %s of key %d (%s FLOW) voided: it was not recorded in "
                            "time", row.token, row.key_id, format_flow(row.amount))
        if len(rows) < _RECONCILE_BATCH:
            return voided


def charges_actor(state: KeysState, *, embedded: bool,
                  shared_lock: Callable[..., AbstractAsyncContextManager[None]]) -> ActorSpec:
    """The ``keys.charges`` actor: reconciles the charge ledger at start, then every
    ``charge_reconcile_seconds``, one process at a time (under the shared lock
    ``keys.charges``).

    :param embedded: one process with an in-process meter: the rows opened before it
        started belong to no one and are voided at once.
    :param shared_lock: ``service.shared.lock``.
    """
    settings = state.settings
    started = utcnow()

    async def once() -> None:
        before = utcnow() - timedelta(seconds=settings.charge_grace_seconds)
        if embedded:
            before = max(before, started)
        async with shared_lock(CHARGES_ACTOR, ttl=max(60.0, settings.charge_grace_seconds)):
            await reconcile(state, before)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            task_status.started()

            async def loop() -> None:
                while True:
                    await until_available(once, what="reconciling charges", log=log)
                    await trio.sleep(settings.charge_reconcile_seconds)

            nursery.start_soon(loop)
            async for envelope in mailbox:  # it takes no messages; it ends when closed
                envelope.fail(TypeError(f"{CHARGES_ACTOR} takes no messages"))
            nursery.cancel_scope.cancel()

    return ActorSpec(name=CHARGES_ACTOR, run=run, mailbox_size=1)

