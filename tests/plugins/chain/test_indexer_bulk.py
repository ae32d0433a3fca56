"""The indexer's many-row writes (``indexer.bulk``) on each database: a range's logs in
multi-row statements, and the derived sums upserted onto rows that exist and rows that do
not, exact beyond 64 bits."""

from __future__ import annotations

from sqlalchemy import select

from plugins.chain.indexed import earned_by_level
from plugins.chain.indexer import bulk, derive
from plugins.chain.indexer.logs import RawLog
from plugins.chain.indexer.store import insert_logs
from plugins.chain.tables import earnings, logs, metadata, positions
from runtime.storage import make_engine

CHAIN_ID = 5
INSTANCE = "0x" + "11" * 20
USER = "0x" + "22" * 20
WEI = 10**18


def _log(index: int) -> RawLog:
    return RawLog(block_number=index // 4, block_hash="0x" + f"{index // 4:064x}",
                  log_index=index % 4, tx_hash="0x" + "ab" * 32, address="0x" + "33" * 20,
                  topics=("0x" + "cd" * 32, "0x" + "00" * 12 + "22" * 20), data="0x")


def test_rows_past_one_statement_and_sums_onto_existing_rows(database_url: str) -> None:
    engine = make_engine(database_url, 1)
    tables = [logs, earnings, positions]
    metadata.create_all(engine, tables=tables)
    try:
        count = bulk.ROWS_PER_STATEMENT + 7  # two statements
        with engine.begin() as connection:
            insert_logs(connection, [_log(index).row(CHAIN_ID, INSTANCE)
                                     for index in range(count)])
        first, second = derive.Deltas(), derive.Deltas()
        first.earnings[(INSTANCE, USER, 0)] = 2**70
        first.positions[(INSTANCE, USER)] = {"activated": True}
        second.earnings[(INSTANCE, USER, 0)] = 5 * WEI  # onto the row the first wrote
        second.earnings[(INSTANCE, USER, 3)] = WEI  # a new row beside it
        second.positions[(INSTANCE, USER)] = {"active_until": 1_700_000_000}
        for deltas in (first, second):
            with engine.begin() as connection:
                derive.write(connection, CHAIN_ID, deltas)
        with engine.connect() as connection:
            stored = connection.execute(select(logs).where(logs.c.chain_id == CHAIN_ID)
                                        .order_by(logs.c.block_number, logs.c.log_index)).all()
            assert [RawLog.from_row(row) for row in stored] == [_log(index)
                                                                for index in range(count)]
            assert {row.event for row in stored} == {"unknown"}
            earned = earned_by_level(connection, CHAIN_ID, INSTANCE, USER)
            position = connection.execute(select(positions)).one()
        assert earned == [2**70 + 5 * WEI, 0, 0, WEI, 0, 0, 0, 0, 0, 0]
        assert (position.activated, position.active_until) == (True, 1_700_000_000)
    finally:
        metadata.drop_all(engine, tables=tables)
        engine.dispose()
