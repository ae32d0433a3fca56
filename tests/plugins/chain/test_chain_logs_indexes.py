"""The partial indexes of ``chain_logs`` (``chain_0004``) serve every read that looks logs
up by block or by account, on each database: each read's statements are captured as the
indexer and the on-chain endpoints run them, and the database's plan for each names the
index. (``tests/runtime/test_migrate.py`` checks the migrations build the declared
indexes.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import Connection, event

from plugins.chain.indexer import derive, store
from plugins.chain.onchain import indexed_logs
from plugins.chain.tables import logs, metadata, positions
from runtime.storage import make_engine

CHAIN_ID = 5
INSTANCE = "0x" + "11" * 20
USER = "0x" + "22" * 20
FACTORY = "0x" + "33" * 20

READS: dict[str, tuple[Callable[[Connection], Any], str]] = {
    "final work": (lambda connection: store.final_logs(connection, CHAIN_ID, 10, 20),
                   "ix_chain_logs_final"),
    "launched instances": (lambda connection: store.launched_instances(
        connection, CHAIN_ID, FACTORY), "ix_chain_logs_final"),
    "bonding of a token": (lambda connection: indexed_logs.bonding_of(
        connection, CHAIN_ID, FACTORY, INSTANCE), "ix_chain_logs_final"),
    "tree of an instance": (lambda connection: indexed_logs.tree_children(
        connection, CHAIN_ID, INSTANCE), "ix_chain_logs_position"),
    "position after a reorg": (lambda connection: derive.recompute_positions(
        connection, CHAIN_ID, {(INSTANCE, USER)}), "ix_chain_logs_position"),
}


def _plans(connection: Connection, read: Callable[[Connection], Any]) -> list[str]:
    """The plan of each ``chain_logs`` statement ``read`` runs, as text."""
    captured: list[tuple[str, Any]] = []

    def capture(_connection: Any, _cursor: Any, statement: str, parameters: Any,
                _context: Any, _many: bool) -> None:
        if "chain_logs" in statement and statement.lstrip().upper().startswith("SELECT"):
            captured.append((statement, parameters))

    event.listen(connection, "before_cursor_execute", capture)
    try:
        read(connection)
    finally:
        event.remove(connection, "before_cursor_execute", capture)
    postgresql = connection.dialect.name == "postgresql"
    if postgresql:  # an empty table: make the planner show what it can use
        connection.exec_driver_sql("SET LOCAL enable_seqscan = off")
    explain = "EXPLAIN " if postgresql else "EXPLAIN QUERY PLAN "
    return [" ".join(str(row[-1]) for row in connection.exec_driver_sql(
        explain + statement, parameters)) for statement, parameters in captured]


@pytest.mark.parametrize("read", sorted(READS))
def test_each_read_by_block_or_account_uses_a_partial_index(database_url: str,
                                                            read: str) -> None:
    engine = make_engine(database_url, 1)
    tables = [logs, positions]
    metadata.create_all(engine, tables=tables)
    try:
        function, index = READS[read]
        with engine.begin() as connection:
            plans = _plans(connection, function)
        assert plans and all(index in plan for plan in plans), plans
    finally:
        metadata.drop_all(engine, tables=tables)
        engine.dispose()
