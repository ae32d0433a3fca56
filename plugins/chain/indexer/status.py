"""What each chain's indexer says about itself, for ``/readyz`` and for tests."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class IndexerStatus:
    """``standby`` while another process holds the chain, ``indexing`` while this one does,
    ``stopped`` after a reorg deeper than the finality depth (``stopped_reason`` says
    which). ``waiting`` names the outage being waited out, if any."""

    state: Literal["starting", "standby", "indexing", "stopped"] = "starting"
    stopped_reason: str | None = None
    waiting: str | None = None
    head: int | None = None
    indexed: int | None = None
    final: int | None = None
