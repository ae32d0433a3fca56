"""Many rows in few statements, through the driver: multi-row ``INSERT``s (or upserts) of up
to ``ROWS_PER_STATEMENT`` rows.

sqlite3's ``executemany`` gives up the GIL for each row; while the indexer's task decodes
the next range, every row then waited for the GIL again, and a range's writes took several
times their own cost. One multi-row statement gives it up once. SQLAlchemy's own building of
many-row statements cost more than the writes (``docs/performance.md``).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

from sqlalchemy import Connection

ROWS_PER_STATEMENT = 1_000


def insert_rows(connection: Connection, table: str, columns: Sequence[str],
                rows: Sequence[Sequence[object]], *, upsert_keys: Sequence[str] = ()) -> None:
    """Insert ``rows`` (values in ``columns`` order) into ``table``. With ``upsert_keys``
    (the primary key), a row whose key exists replaces that row's other columns instead
    (``ON CONFLICT ... DO UPDATE``, as SQLite and PostgreSQL both write it); the rows must
    then have distinct keys."""
    if not rows:
        return
    postgresql = connection.dialect.name == "postgresql"
    per_statement = ROWS_PER_STATEMENT
    if not postgresql:
        driver = connection.connection.driver_connection
        assert isinstance(driver, sqlite3.Connection)
        per_statement = min(per_statement, driver.getlimit(
            sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER) // len(columns))
    mark = "%s" if postgresql else "?"
    values = "(" + ", ".join([mark] * len(columns)) + ")"
    conflict = ""
    if upsert_keys:
        updated = [column for column in columns if column not in upsert_keys]
        conflict = (f" ON CONFLICT ({', '.join(upsert_keys)}) DO UPDATE SET "
                    + ", ".join(f"{column} = excluded.{column}" for column in updated))
    head = f"INSERT INTO {table} ({', '.join(columns)}) VALUES "
    for start in range(0, len(rows), per_statement):
        chunk = rows[start:start + per_statement]
        connection.exec_driver_sql(head + ", ".join([values] * len(chunk)) + conflict,
                                   tuple(value for row in chunk for value in row))
