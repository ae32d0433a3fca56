"""The indexer's transactions. Each one first renews its lease (and fails if another process
holds the chain now), so what a process that lost the chain still had in flight rolls back
instead of counting twice; everything a step produced commits with its cursor.

The lease is the claim the billing scheduler and the webhook dispatcher use: an owner and an
expiry on a row (``chain_cursors``), taken by a compare-and-set once the expiry passed. On
PostgreSQL the renewing ``UPDATE`` also locks the row until the transaction ends, so two
indexer transactions of one chain never overlap.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta

from sqlalchemy import Connection, delete, insert, or_, select, update
from sqlalchemy.exc import IntegrityError

from plugins.chain.indexer import derive
from plugins.chain.indexer.bulk import insert_rows
from plugins.chain.indexer.logs import LOG_COLUMNS, Followed, RawLog
from plugins.chain.tables import FINAL_LOGS, blocks, cursors, logs, tokens, unreadable_tokens
from runtime.errors import Unavailable
from runtime.wire import utcnow


class LeaseLost(Unavailable):
    """Another process holds the chain now: this process's transaction rolls back and its
    indexer goes back to waiting for the lease."""


@dataclass(frozen=True)
class BlockRef:
    number: int
    hash: str
    parent_hash: str
    time: int


@dataclass(frozen=True)
class Cursor:
    """Where a chain's indexing stands: the newest indexed block (None before the first),
    the newest final block and the non-final blocks kept (with the final one), by number."""

    head: BlockRef | None
    final_number: int | None
    recent: dict[int, BlockRef]


def take_lease(connection: Connection, chain_id: int, owner: str,
               seconds: float) -> Cursor | None:
    """Take (or keep) the chain's lease for ``owner``; the cursor if it is ours now, None
    while another process holds it."""
    try:
        with connection.begin_nested():
            connection.execute(insert(cursors).values(chain_id=chain_id))
    except IntegrityError:
        pass  # the row exists: the usual case
    now = utcnow()
    taken = connection.execute(
        update(cursors).where(cursors.c.chain_id == chain_id)
        .where(or_(cursors.c.lease_owner.is_(None), cursors.c.lease_owner == owner,
                   cursors.c.lease_until < now))
        .values(lease_owner=owner, lease_until=now + timedelta(seconds=seconds)))
    if taken.rowcount != 1:
        return None
    return load_cursor(connection, chain_id)


def load_cursor(connection: Connection, chain_id: int) -> Cursor:
    row = connection.execute(select(cursors).where(cursors.c.chain_id == chain_id)).one()
    recent = {block.number: BlockRef(block.number, block.hash, block.parent_hash, block.time)
              for block in connection.execute(select(blocks).where(blocks.c.chain_id == chain_id))}
    head = None
    if row.block_number is not None:
        head = recent.get(row.block_number) or BlockRef(row.block_number, row.block_hash, "",
                                                        row.block_time)
    return Cursor(head, row.final_number, recent)


def release_lease(connection: Connection, chain_id: int, owner: str) -> None:
    connection.execute(update(cursors).where(cursors.c.chain_id == chain_id,
                                             cursors.c.lease_owner == owner)
                       .values(lease_owner=None, lease_until=None))


def hold_lease(connection: Connection, chain_id: int, owner: str, seconds: float) -> None:
    """Renew the lease inside the current transaction.

    :raises LeaseLost: another process took the chain.
    """
    renewed = connection.execute(
        update(cursors).where(cursors.c.chain_id == chain_id, cursors.c.lease_owner == owner)
        .values(lease_until=utcnow() + timedelta(seconds=seconds)))
    if renewed.rowcount != 1:
        raise LeaseLost(f"chain {chain_id}: another process holds the indexer's lease")


@dataclass(frozen=True)
class Step:
    """What one indexer transaction commits: the followed logs of the blocks it indexed (in
    order) as ``chain_logs`` rows and as the deltas they add, the blocks it keeps as not yet
    final, the new head and final number, and the work of the blocks that became final (run
    inside the same transaction). Made by ``step_of`` outside the database thread."""

    rows: list[tuple[object, ...]]
    deltas: derive.Deltas
    blocks: list[BlockRef]
    head: BlockRef
    final_number: int
    on_final: Callable[[Connection], None] | None = None


def step_of(chain_id: int, followed: Followed, logs: Sequence[RawLog], blocks: list[BlockRef],
            head: BlockRef, final_number: int,
            on_final: Callable[[Connection], None] | None = None) -> Step:
    """The step storing ``logs`` (decoded and summed here: the CPU work of a step, done
    while the database thread writes the step before)."""
    rows = [log.row(chain_id, followed.instance_of(log.address)) for log in logs]
    return Step(rows, derive.deltas_of(followed, logs, 1), blocks, head, final_number,
                on_final)


def commit_step(connection: Connection, chain_id: int, owner: str, lease_seconds: float,
                step: Step) -> None:
    """Store a step: its raw logs and their deltas, its blocks, the cursor; then the final
    work, and forget the blocks below the final one.

    :raises LeaseLost: another process holds the chain (everything rolls back).
    """
    hold_lease(connection, chain_id, owner, lease_seconds)
    if step.rows:
        insert_logs(connection, step.rows)
        derive.write(connection, chain_id, step.deltas)
    if step.blocks:
        connection.execute(insert(blocks), [
            {"chain_id": chain_id, "number": block.number, "hash": block.hash,
             "parent_hash": block.parent_hash, "time": block.time} for block in step.blocks])
    connection.execute(update(cursors).where(cursors.c.chain_id == chain_id).values(
        block_number=step.head.number, block_hash=step.head.hash, block_time=step.head.time,
        final_number=step.final_number))
    if step.on_final is not None:
        step.on_final(connection)
    connection.execute(delete(blocks).where(blocks.c.chain_id == chain_id,
                                            blocks.c.number < step.final_number))


def insert_logs(connection: Connection, rows: Sequence[tuple[object, ...]]) -> None:
    """Insert ``rows`` (``RawLog.row``'s, in ``LOG_COLUMNS`` order) in as few statements as
    the driver allows: ``COPY`` on PostgreSQL, multi-row ``INSERT``s on SQLite (``bulk``)."""
    if connection.dialect.name != "postgresql":
        insert_rows(connection, logs.name, LOG_COLUMNS, rows)
        return
    driver = connection.connection.driver_connection
    assert driver is not None
    with driver.cursor() as cursor, cursor.copy(
            f"COPY {logs.name} ({', '.join(LOG_COLUMNS)}) FROM STDIN") as copy:
        for row in rows:
            copy.write_row(row)


def roll_back(connection: Connection, chain_id: int, owner: str, lease_seconds: float,
              followed: Followed, ancestor: BlockRef) -> int:
    """Undo every block after ``ancestor``: the inverse deltas of their logs, the logs, the
    blocks; the cursor moves back to ``ancestor``. Returns how many blocks were dropped.

    :raises LeaseLost: another process holds the chain (nothing changes).
    """
    hold_lease(connection, chain_id, owner, lease_seconds)
    dropped = connection.execute(
        select(blocks.c.hash).where(blocks.c.chain_id == chain_id,
                                    blocks.c.number > ancestor.number)).scalars().all()
    dropped_logs = [RawLog.from_row(row) for row in connection.execute(
        select(logs).where(logs.c.chain_id == chain_id, logs.c.block_hash.in_(dropped))
        .order_by(logs.c.block_number.desc(), logs.c.log_index.desc()))]
    touched = derive.apply(connection, chain_id, followed, dropped_logs, -1)
    connection.execute(delete(logs).where(logs.c.chain_id == chain_id,
                                          logs.c.block_hash.in_(dropped)))
    derive.recompute_positions(connection, chain_id, touched)
    connection.execute(delete(blocks).where(blocks.c.chain_id == chain_id,
                                            blocks.c.number > ancestor.number))
    connection.execute(update(cursors).where(cursors.c.chain_id == chain_id).values(
        block_number=ancestor.number, block_hash=ancestor.hash, block_time=ancestor.time))
    return len(dropped)


def launched_instances(connection: Connection, chain_id: int, factory: str) -> list[RawLog]:
    """The factory's ``Launched`` logs indexed so far, oldest first."""
    return [RawLog.from_row(row) for row in connection.execute(
        select(logs).where(logs.c.chain_id == chain_id, FINAL_LOGS, logs.c.address == factory,
                           logs.c.event == "Launched")
        .order_by(logs.c.block_number, logs.c.log_index))]


def registered_instances(connection: Connection, chain_id: int) -> dict[str, str]:
    """The dpnm instances of the token registry on this chain, with their slugs."""
    return {row.instance_address: row.slug for row in connection.execute(
        select(tokens.c.instance_address, tokens.c.slug)
        .where(tokens.c.chain_id == chain_id, tokens.c.template == "dpnm")
        .order_by(tokens.c.instance_address))}


def mark_unreadable(connection: Connection, chain_id: int, unreadable: Mapping[str, str],
                    readable: Sequence[str]) -> None:
    """Store which instances the indexer could not read (instance to reason), and forget
    the marks of those it could."""
    checked = [*unreadable, *readable]
    if checked:
        connection.execute(delete(unreadable_tokens).where(
            unreadable_tokens.c.chain_id == chain_id,
            unreadable_tokens.c.instance.in_(checked)))
    if unreadable:
        now = utcnow()
        connection.execute(insert(unreadable_tokens), [
            {"chain_id": chain_id, "instance": instance, "reason": reason[:200],
             "checked_at": now} for instance, reason in unreadable.items()])


def final_logs(connection: Connection, chain_id: int, first: int, last: int) -> list[RawLog]:
    """The followed ``Launched`` and ``Sold`` logs (``FINAL_EVENTS``) of blocks
    ``first..last`` (final: one branch only), in order."""
    return [RawLog.from_row(row) for row in connection.execute(
        select(logs).where(logs.c.chain_id == chain_id, FINAL_LOGS,
                           logs.c.block_number >= first, logs.c.block_number <= last)
        .order_by(logs.c.block_number, logs.c.log_index))]

