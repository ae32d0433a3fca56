"""The declared schema of a service, for comparing with what its migrations built."""

from __future__ import annotations

from sqlalchemy import MetaData


def combined_metadata(items: list[MetaData]) -> MetaData:
    """One MetaData holding the tables of every enabled plugin."""
    combined = MetaData()
    for metadata in items:
        for table in metadata.tables.values():
            table.to_metadata(combined)
    return combined
