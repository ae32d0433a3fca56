"""Retention of append-only tables, and their time partitions on PostgreSQL.

A plugin declares its append-only tables (``flowsvc_retained_tables``): the table, its time
column, how many days of rows to keep and the width of a partition in days. The
``core.retention`` actor keeps each one at start and every ``[retention] check_seconds``:

- **On PostgreSQL**, a table declared ``partitioned`` is a table ``PARTITION BY RANGE`` of
  its time column (its plugin's migration made it so) with a ``<table>_default`` partition.
  The actor creates the partitions of the ``[retention] partitions_ahead`` intervals after
  the current one, so rows land in a partition made before their day began, and drops the
  partitions that end at or before the cutoff: no ``DELETE``, no bloat, no vacuum. The
  default partition catches rows no partition was made for (rows of the day a table was
  partitioned, or beyond the partitions made ahead while the actor could not run): an
  insert never fails for want of a partition. Rows waiting there are moved into a
  partition of their own once their interval ended an interval ago (when nothing writes
  there any more: an insert routed to the default partition just before a partition of
  its range was attached would be refused), so a migration can put every existing row in
  the default partition and leave their spreading to the actor.
- **On SQLite, and for tables not partitioned**, rows before the cutoff are deleted in
  batches, one transaction each.

The cutoff is ``now - retention_days``, rounded down to a partition boundary (intervals
are counted in whole UTC days from the Unix epoch), on both databases: what a table keeps
does not depend on the database, and a table purged by ``DELETE`` next to a partitioned one
with the same ``interval_days`` (the usage rollups beside the usage log) keeps exactly the
same days.

Only one process maintains a table at a time: each partition is made in a transaction of
its own, and the expired ones dropped in one more, each first taking a PostgreSQL advisory
lock named after the schema and table (``pg_try_advisory_xact_lock``) and skipping the work
when another process holds it. The work is idempotent (it makes what is missing and drops
what is expired), so the next round of whichever process gets the lock finishes what an
interrupted one left. Dropping a partition takes an ``ACCESS EXCLUSIVE`` lock on the table
for a moment: inserts wait for it and are never refused. The maintenance gives way to the
service's writes: past a short ``lock_timeout``, or chosen as a deadlock's victim, it
stops and tries again next round.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import trio
from sqlalchemy import Connection, Table, delete, select, text, tuple_
from sqlalchemy.exc import OperationalError

from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available
from runtime.storage import Database
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.retention")
RETENTION_ACTOR = "core.retention"
DELETE_BATCH = 10_000
_DAY = timedelta(days=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# A partition is dropped under an ACCESS EXCLUSIVE lock, and made under an EXCLUSIVE one on
# the default partition; inserts queue behind it while it waits for the lock, so it gives up
# soon and tries again next round. Shorter than PostgreSQL's default deadlock_timeout (1 s):
# when the maintenance and a writer wait on each other (attaching a partition locks the table
# its foreign key names, which a charge's transaction updates), the maintenance's wait ends
# first and it gives way before a deadlock check could pick the writer as the victim.
_LOCK_TIMEOUT = "500ms"
# Lock timeout and deadlock: the maintenance gave way to writers; it runs again next round.
_GIVE_WAY = ("55P03", "40P01")
# The first key of the two-key advisory locks this module takes (runtime.migrate has its own).
_ADVISORY_LOCK_CLASS = int.from_bytes(b"keep", "big") >> 1  # any fixed int4


@dataclass(frozen=True)
class RetainedTable:
    """An append-only table whose rows older than ``retention_days`` go.

    :param table: the table; its primary key batches the deletes.
    :param time_column: the column the rows are kept by (and partitioned by).
    :param retention_days: days of rows kept (whole intervals are dropped, so up to
        ``interval_days`` more are kept).
    :param interval_days: the width of a partition, and what the cutoff is rounded to.
    :param partitioned: True when the table is range-partitioned on PostgreSQL.
    """

    table: Table
    time_column: str
    retention_days: int
    interval_days: int = 1
    partitioned: bool = True


def interval_start(moment: datetime, interval_days: int) -> datetime:
    """The start of the interval of ``interval_days`` days holding ``moment``."""
    days = (moment - _EPOCH) // _DAY
    return _EPOCH + timedelta(days=days - days % interval_days)


def cutoff(retained: RetainedTable, now: datetime) -> datetime:
    """Rows before this moment are dropped."""
    return interval_start(now - timedelta(days=retained.retention_days), retained.interval_days)


def partition_name(table: str, start: datetime) -> str:
    return f"{table}_p{start:%Y%m%d}"


def default_partition_name(table: str) -> str:
    return f"{table}_default"


def partitions(connection: Connection, table: str) -> dict[str, datetime]:
    """The range partitions of ``table`` by name, with the start of each."""
    rows = connection.execute(text(
        "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = inhrelid "
        "WHERE inhparent = CAST(:table AS regclass)"), {"table": table}).scalars()
    prefix = f"{table}_p"
    return {name: datetime.strptime(name[len(prefix):], "%Y%m%d").replace(tzinfo=UTC)
            for name in rows if name.startswith(prefix)}


def _lock(connection: Connection, table: str) -> bool:
    """Take the table's lock for this transaction, unless another process holds it."""
    return bool(connection.execute(text(
        "SELECT pg_try_advisory_xact_lock(:class, hashtext(current_schema() || '.' || :table))"),
        {"class": _ADVISORY_LOCK_CLASS, "table": table}).scalar_one())


def _create_partition(connection: Connection, retained: RetainedTable, start: datetime) -> None:
    """Create the partition starting at ``start``, with the rows of its range that wait in
    the default partition (attaching refuses while the default partition holds any)."""
    quote = connection.dialect.identifier_preparer.quote
    table, column = retained.table.name, quote(retained.time_column)
    end = start + timedelta(days=retained.interval_days)
    name = partition_name(table, start)
    bounds = {"start": start, "end": end}
    default = quote(default_partition_name(table))
    # Inserts into the default partition wait until the partition is attached: a row of
    # its range committed there after the move would make the attach fail.
    connection.exec_driver_sql(f"LOCK TABLE {default} IN EXCLUSIVE MODE")
    connection.exec_driver_sql(f"CREATE TABLE {quote(name)} (LIKE {quote(table)})")
    connection.execute(text(
        f"WITH moved AS (DELETE FROM {default} "
        f"WHERE {column} >= :start AND {column} < :end RETURNING *) "
        f"INSERT INTO {quote(name)} SELECT * FROM moved"), bounds)
    # DDL takes no bound parameters; the bounds are formatted from datetimes.
    connection.exec_driver_sql(
        f"ALTER TABLE {quote(table)} ATTACH PARTITION {quote(name)} "
        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{end.isoformat()}')")


def missing_partitions(connection: Connection, retained: RetainedTable, now: datetime,
                       ahead: int) -> list[datetime]:
    """The starts of the partitions to make, newest first: the ``ahead`` intervals after
    the one holding ``now``, then those of the kept rows waiting in the default partition
    whose interval ended an interval ago or more.

    Never a partition rows are being written to: an insert routed to the default partition
    before the partition of its row was attached would be refused once attached."""
    quote = connection.dialect.identifier_preparer.quote
    table, column = retained.table.name, quote(retained.time_column)
    width = timedelta(days=retained.interval_days)
    current = interval_start(now, retained.interval_days)
    waiting = connection.execute(text(
        f"SELECT DISTINCT CAST(floor(extract(epoch FROM {column}) / :width) AS BIGINT) "
        f"FROM {quote(default_partition_name(table))} WHERE {column} >= :cutoff "
        f"AND {column} < :settled"),
        {"width": width.total_seconds(), "cutoff": cutoff(retained, now),
         "settled": current - width}).scalars()
    starts = {current + index * width for index in range(1, ahead + 1)}
    starts |= {_EPOCH + number * width for number in waiting}
    existing = partitions(connection, table)
    return sorted((start for start in starts if partition_name(table, start) not in existing),
                  reverse=True)


def create_partition(connection: Connection, retained: RetainedTable, start: datetime) -> bool:
    """Create the partition starting at ``start``; False when another process holds the
    table or made it already."""
    if not _lock(connection, retained.table.name):
        return False
    if partition_name(retained.table.name, start) in partitions(connection, retained.table.name):
        return False
    connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    _create_partition(connection, retained, start)
    return True


def drop_expired(connection: Connection, retained: RetainedTable, now: datetime) -> list[str]:
    """Drop the partitions that end at or before the cutoff and delete the default
    partition's rows before it; the partitions dropped."""
    table = retained.table.name
    if not _lock(connection, table):
        return []
    quote = connection.dialect.identifier_preparer.quote
    oldest_kept = cutoff(retained, now)
    width = timedelta(days=retained.interval_days)
    connection.exec_driver_sql(f"SET LOCAL lock_timeout = '{_LOCK_TIMEOUT}'")
    dropped: list[str] = []
    for name, begins in sorted(partitions(connection, table).items()):
        if begins + width > oldest_kept:
            continue
        connection.exec_driver_sql(f"DROP TABLE {quote(name)}")
        dropped.append(name)
    connection.execute(text(
        f"DELETE FROM {quote(default_partition_name(table))} "
        f"WHERE {quote(retained.time_column)} < :cutoff"), {"cutoff": oldest_kept})
    return dropped


def delete_expired(connection: Connection, retained: RetainedTable, now: datetime) -> int:
    """Delete up to ``DELETE_BATCH`` rows before the cutoff; how many were deleted."""
    table = retained.table
    key = tuple_(*table.primary_key.columns)
    expired = (select(*table.primary_key.columns)
               .where(table.c[retained.time_column] < cutoff(retained, now))
               .limit(DELETE_BATCH))
    return int(connection.execute(delete(table).where(key.in_(expired))).rowcount)


async def maintain(db: Database, retained: RetainedTable, now: datetime,
                   ahead: int) -> dict[str, Any]:
    """Keep ``retained`` as of ``now``, one transaction per partition made and one for the
    rest: what was created, dropped or deleted."""
    if retained.partitioned and db.dialect == "postgresql":
        created = [partition_name(retained.table.name, start)
                   for start in await db.read(missing_partitions, retained, now, ahead)
                   if await db.write(create_partition, retained, start)]
        return {"created": created, "dropped": await db.write(drop_expired, retained, now)}
    deleted = 0
    while True:
        batch = await db.write(delete_expired, retained, now)
        deleted += batch
        if batch < DELETE_BATCH:
            return {"deleted": deleted}


def retention_actor(db: Database, tables: list[RetainedTable], *, check_seconds: float,
                    ahead: int) -> ActorSpec:
    """The ``core.retention`` actor: maintains ``tables`` at start and every
    ``check_seconds``."""

    async def keep(retained: RetainedTable) -> None:
        try:
            done = await until_available(lambda: maintain(db, retained, utcnow(), ahead),
                                         what=f"keeping {retained.table.name}", log=log)
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) not in _GIVE_WAY:
                raise
            log.warning("retention of %s gave way to the service's writes; next round: %s",
                        retained.table.name, exc.orig)
            return
        if done.get("created") or done.get("dropped") or done.get("deleted"):
            log.info("retention of %s: %s", retained.table.name, done)

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            for retained in tables:
                await keep(retained)
            await trio.sleep(check_seconds)

    return ActorSpec(name=RETENTION_ACTOR, run=run)
