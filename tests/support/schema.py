"""The declared schema of a service, for comparing with what its migrations built."""

from __future__ import annotations

from typing import Any

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import Connection, MetaData, text


def combined_metadata(items: list[MetaData]) -> MetaData:
    """One MetaData holding the tables of every enabled plugin."""
    combined = MetaData()
    for metadata in items:
        for table in metadata.tables.values():
            table.to_metadata(combined)
    return combined


def partitions(connection: Connection) -> set[str]:
    """The partitions of PostgreSQL's partitioned tables: made by their migrations and the
    retention actor (``runtime.retention``), never declared in a ``MetaData``."""
    if connection.dialect.name != "postgresql":
        return set()
    return set(connection.execute(text(
        "SELECT relname FROM pg_class WHERE relispartition "
        "AND relnamespace = CAST(current_schema() AS regnamespace)")).scalars())


def drift(connection: Connection, items: list[MetaData]) -> list[Any]:
    """What differs between the database and the declared tables (partitions aside)."""
    skipped = partitions(connection)
    context = MigrationContext.configure(connection, opts={
        "compare_type": True,
        "include_name": lambda name, kind, parents: not (kind == "table" and name in skipped)})
    return list(compare_metadata(context, combined_metadata(items)))
