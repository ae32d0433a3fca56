"""What each chain's indexer says about itself, for ``/readyz`` and for tests."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class IndexerStatus:
    """``standby`` while another process holds the chain, ``indexing`` while this one does,
    ``stopped`` after a reorg deeper than the finality depth (``stopped_reason`` says
    which). ``waiting`` names the outage being waited out, if any. ``unreadable`` names the
    tokens the indexer could not read (slug, or the instance address, to the reason)."""

    state: Literal["starting", "standby", "indexing", "stopped"] = "starting"
    stopped_reason: str | None = None
    waiting: str | None = None
    head: int | None = None
    indexed: int | None = None
    indexed_hash: str | None = None  # of the block the database holds as indexed, once known
    final: int | None = None
    unreadable: dict[str, str] = field(default_factory=dict)
