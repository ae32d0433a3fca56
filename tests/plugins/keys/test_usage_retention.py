"""The usage log's retention (day partitions on PostgreSQL, deletes on SQLite), its rollups,
and the migration that partitions a log already holding rows (``runtime.retention``,
``plugins.keys.rollups``, keys_0004)."""

from __future__ import annotations

import random
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio
from alembic import command
from sqlalchemy import Connection, func, insert, select, text

from plugins.keys import rollups
from plugins.keys.tables import api_key_usage, api_key_usage_rollups, api_keys
from plugins.keys.usage import UsageEntry, write_entries
from runtime.bootstrap import open_service
from runtime.migrate import alembic_config
from runtime.retention import RETENTION_ACTOR, RetainedTable, maintain
from runtime.server import Running
from runtime.service import Service
from runtime.users import users
from tests.support.keys import keys_env
from tests.support.server import make_settings

NOW = datetime(2026, 6, 15, 12, 30, 15, tzinfo=UTC)
RETAINED = RetainedTable(api_key_usage, "at", retention_days=30)
ROLLUPS = RetainedTable(api_key_usage_rollups, "bucket_start", retention_days=30,
                        partitioned=False)


def _user_with_key(connection: Connection) -> int:
    user_id = connection.execute(insert(users).values(
        display_name="retention", created_at=NOW).returning(users.c.id)).scalar_one()
    return int(connection.execute(insert(api_keys).values(
        user_id=user_id, name="k", prefix="sk_live_abc", key_hash=f"hash-{user_id}",
        rate_limit_rpm=0, spend_limit=None, spend_period="month", spend_epoch=0,
        spend_period_key=0, spend_used=0, created_at=NOW, updated_at=NOW)
        .returning(api_keys.c.id)).scalar_one())


def _entry(key_id: int, at: datetime, index: int) -> UsageEntry:
    status = (200, 201, 402, 404, 429, 500, None)[index % 7]
    return UsageEntry(key_id, at, "charge" if status is None else "request", "GET", "/me",
                      status, 1000 + index, ("gpt-a", "gpt-b", None)[index % 3],
                      None if status is None else 50 + index, f"req-{index}")


def _ids_by_day(connection: Connection) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {}
    for row in connection.execute(select(api_key_usage.c.id, api_key_usage.c.at)):
        at = row.at if row.at.tzinfo else row.at.replace(tzinfo=UTC)
        found.setdefault(f"{at:%Y%m%d}", set()).add(row.id)
    return found


def _partitions(connection: Connection) -> set[str]:
    return set(connection.execute(text(
        "SELECT child.relname FROM pg_inherits JOIN pg_class child ON child.oid = inhrelid "
        "WHERE inhparent = CAST('api_key_usage' AS regclass)")).scalars())


def _raw_totals(connection: Connection, key_id: int, since: datetime | None) -> Counter[Any]:
    """What the rollups must add up to, counted from the log's rows."""
    usage = api_key_usage.c
    query = select(api_key_usage).where(usage.key_id == key_id)
    if since is not None:
        query = query.where(usage.at >= since)
    totals: Counter[Any] = Counter()
    for row in connection.execute(query):
        group = (row.kind, row.model or "unknown", rollups.outcome(row.status))
        totals[(*group, "calls")] += 1
        totals[(*group, "cost")] += row.cost
        totals[(*group, "latency")] += row.latency_us or 0
    return totals


def _rolled_up_totals(connection: Connection, key_id: int, since: datetime | None
                      ) -> Counter[Any]:
    totals: Counter[Any] = Counter()
    for group in rollups.totals(connection, [key_id], since):
        name = (group.kind, group.model, group.outcome)
        totals[(*name, "calls")] += group.calls
        totals[(*name, "cost")] += group.cost
        totals[(*name, "latency")] += group.latency_us
    return +totals


def _service(tmp_path: Path, database_url: str) -> Any:
    return open_service(make_settings(keys_env(tmp_path / "var", database_url, "")),
                        migrate=True)


async def test_retention_drops_old_days_while_inserts_go_on(tmp_path: Path,
                                                          database_url: str) -> None:
    async with _service(tmp_path, database_url) as service:
        db = service.db
        key_id = await db.write(_user_with_key)
        days_back = (45, 40, 31, 29, 20, 1)
        await db.write(write_entries, [_entry(key_id, NOW - timedelta(days=days, seconds=i), i)
                                       for days in days_back for i in range(5)])
        # As of ten days ago: the day 45 days back is past retention, 40 days back is kept.
        first = await maintain(db, RETAINED, NOW - timedelta(days=10), ahead=3)
        before = await db.read(_ids_by_day)
        assert f"{NOW - timedelta(days=45):%Y%m%d}" not in before
        assert len(before[f"{NOW - timedelta(days=40):%Y%m%d}"]) == 5
        if db.dialect == "postgresql":
            # The days of kept rows in the default partition, and three days ahead.
            assert set(first["created"]) == {
                f"api_key_usage_p{NOW - timedelta(days=days):%Y%m%d}"
                for days in (40, 31, 29, 20, 9, 8, 7)}

        inserted: list[int] = []
        started, maintained = trio.Event(), trio.Event()

        async def insert_rows() -> None:
            """Insert one row a transaction until five more went in after the maintenance."""
            index, last = 0, None
            while last is None or index < last:
                await db.write(write_entries, [_entry(key_id, NOW - timedelta(seconds=index),
                                                      index)])
                inserted.append(index)
                index += 1
                if index == 5:
                    started.set()
                if last is None and maintained.is_set():
                    last = index + 5

        async with trio.open_nursery() as nursery:
            nursery.start_soon(insert_rows)
            await started.wait()
            done = await maintain(db, RETAINED, NOW, ahead=3)
            await maintain(db, ROLLUPS, NOW, ahead=3)
            maintained.set()

        after = await db.read(_ids_by_day)
        cutoff_day = datetime(2026, 5, 16, tzinfo=UTC)  # NOW - 30 days, at midnight
        for day, ids in before.items():
            if day >= f"{cutoff_day:%Y%m%d}":
                assert ids <= after[day], day  # nothing of the kept range lost
            else:
                assert day not in after, day
        assert len(after[f"{NOW:%Y%m%d}"]) == len(inserted)  # every concurrent insert
        if db.dialect == "postgresql":
            expired = {f"api_key_usage_p{NOW - timedelta(days=days):%Y%m%d}"
                       for days in (40, 31)}
            assert expired <= set(done["dropped"])
            left = await db.read(_partitions)
            assert not expired & left
            assert f"api_key_usage_p{NOW + timedelta(days=3):%Y%m%d}" in left
        # The rollups go with the log's days: "all" still adds up to the log.
        assert await db.read(_rolled_up_totals, key_id, None) == \
            await db.read(_raw_totals, key_id, None)


async def test_rollups_add_up_to_the_log_from_any_moment(tmp_path: Path,
                                                        database_url: str) -> None:
    async with _service(tmp_path, database_url) as service:
        key_id = await service.db.write(_user_with_key)
        draw = random.Random(20)
        entries = [_entry(key_id, NOW - timedelta(seconds=draw.randrange(3 * 86400)), i)
                   for i in range(600)]
        for start in range(0, len(entries), 100):
            await service.db.write(write_entries, entries[start:start + 100])
        moments = [None, NOW - timedelta(days=2, hours=5, minutes=3, seconds=7),
                   NOW - timedelta(hours=1), datetime(2026, 6, 14, tzinfo=UTC),
                   NOW - timedelta(seconds=30), *(entry.at for entry in entries[:5])]
        for since in moments:
            assert await service.db.read(_rolled_up_totals, key_id, since) == \
                await service.db.read(_raw_totals, key_id, since), since


def _migrate_to_keys_0003(service: Service) -> None:
    config = alembic_config(service)
    with service.db.engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, "keys_0003")


def _old_rows(connection: Connection, key_id: int) -> None:
    connection.execute(insert(api_key_usage), [
        {"key_id": entry.key_id, "at": entry.at, "kind": entry.kind, "method": entry.method,
         "route": entry.route, "status": entry.status, "cost": entry.cost,
         "model": entry.model, "latency_us": entry.latency_us, "request_id": entry.request_id}
        for entry in (_entry(key_id, NOW - timedelta(hours=i * 3, seconds=i), i)
                      for i in range(200))])


async def test_the_migration_keeps_the_logged_rows_and_rolls_them_up(
        tmp_path: Path, database_url: str) -> None:
    settings = make_settings(keys_env(tmp_path / "var", database_url, ""))
    async with open_service(settings, migrate=False) as old:
        await trio.to_thread.run_sync(_migrate_to_keys_0003, old)
        key_id = await old.db.write(_user_with_key)
        await old.db.write(_old_rows, key_id)
        before = await old.db.read(_ids_by_day)
        raw = await old.db.read(_raw_totals, key_id, None)
    async with open_service(settings, migrate=True) as service:
        db = service.db
        assert await db.read(_ids_by_day) == before
        assert await db.read(_rolled_up_totals, key_id, None) == raw
        # Filled at every width: totals from moments that need minutes and hours agree too.
        seventh = NOW - timedelta(hours=21, seconds=7)  # a row's time (see _old_rows)
        for since in (seventh - timedelta(seconds=20), seventh - timedelta(minutes=10),
                      seventh - timedelta(hours=2), NOW - timedelta(days=6, seconds=7)):
            assert await db.read(_rolled_up_totals, key_id, since) == \
                await db.read(_raw_totals, key_id, since), since
        # New rows take ids after the old ones, from the same sequence.
        await db.write(write_entries, [_entry(key_id, NOW, 1)])
        newest = await db.read(lambda c: c.execute(select(func.max(api_key_usage.c.id)))
                               .scalar_one())
        assert newest > max(max(ids) for ids in before.values())
        if db.dialect == "postgresql":
            assert await db.read(lambda c: c.execute(text(
                "SELECT count(*) FROM pg_partitioned_table "
                "WHERE partrelid = CAST('api_key_usage' AS regclass)")).scalar_one()) == 1
            # The retention actor spreads the old rows out of the default partition, all
            # but those of yesterday and today, which may still be written to.
            await maintain(db, RETAINED, NOW, ahead=3)
            waiting = await db.read(lambda c: c.execute(text(
                "SELECT min(at) FROM api_key_usage_default")).scalar_one())
            assert waiting >= datetime(2026, 6, 14, tzinfo=UTC)
            assert len(await db.read(_partitions)) == 1 + 3 + 24  # default, ahead, 24 days
            assert sum(map(len, (await db.read(_ids_by_day)).values())) == \
                sum(map(len, before.values())) + 1


async def test_a_running_service_makes_the_days_ahead(server: Running) -> None:
    """The keys plugin declares its tables; the core's actor makes their partitions."""
    db = server.service.db
    assert server.service.registry.lookup(RETENTION_ACTOR) is not None
    if db.dialect != "postgresql":
        return
    today = datetime.now(UTC)
    # Two of the three days ahead, whichever side of midnight the actor's round fell.
    ahead = {f"api_key_usage_p{today + timedelta(days=days):%Y%m%d}" for days in (1, 2)}
    with trio.fail_after(30):
        while not ahead <= await db.read(_partitions):  # noqa: ASYNC110 (only the database shows it)
            await trio.sleep(0.1)
