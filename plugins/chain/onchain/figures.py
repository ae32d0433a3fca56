"""The indexed figures of ``GET /me/flow-onchain`` (a user's earnings and subtree by level),
kept in the process per (chain, indexed block): they change only when the indexer commits or
rolls back, so a repeat caller costs no database round trip.

Which block is indexed now: the indexer's own status when this process indexes the chain
and is not waiting out an outage (set as each of its transactions commits or rolls back, so
never behind the database; an indexer that waits may have lost the chain to another); else
the database, asked at most once per ``cache_seconds`` (another process indexes: its next
block shows up that much later at most, as the short position cache's answers do).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import trio
from sqlalchemy import Connection

from plugins.chain.indexed import earned_by_level, indexed_head
from plugins.chain.indexer.status import IndexerStatus
from plugins.chain.onchain.indexed_logs import Children, subtree_by_level, tree_children
from runtime.storage import Database

CACHE_SECONDS = 1.0
CACHE_ENTRIES = 10_000

Figures = tuple[list[int], list[int]]  # earned by level, subtree by level
Wanted = tuple[int, str]  # (chain id, flow instance)


@dataclass
class IndexedFigures:
    """The cache: each (chain, address)'s figures with the indexed block they were read at,
    each (chain, instance)'s indexed tree, and the indexed block last read from the database
    per chain (with when)."""

    cache_seconds: float = CACHE_SECONDS
    figures: OrderedDict[tuple[int, str], tuple[str, Figures]] = field(
        default_factory=OrderedDict)
    trees: dict[Wanted, tuple[str, Children]] = field(default_factory=dict)
    read_heads: dict[int, tuple[float, str | None]] = field(default_factory=dict)

    async def of(self, db: Database, statuses: Mapping[int, IndexerStatus],
                 chains: Sequence[Wanted], address: str) -> dict[int, Figures]:
        """``address``'s figures on each of ``chains`` (chain id, flow instance); one
        database read for those not kept at their chain's indexed block, none otherwise."""
        address = address.lower()
        found: dict[int, Figures] = {}
        missing: list[Wanted] = []
        for chain_id, instance in chains:
            head = self.indexed_hash(chain_id, statuses.get(chain_id))
            kept = self.figures.get((chain_id, address))
            if head is not None and kept is not None and kept[0] == head:
                found[chain_id] = kept[1]
            else:
                missing.append((chain_id, instance))
        if not missing:
            return found
        read = await db.read(self._read, missing, address)
        now = trio.current_time()
        for chain_id, (head, figures) in read.items():
            found[chain_id] = figures
            self.read_heads[chain_id] = (now, head)
            if head is not None:
                self._keep((chain_id, address), (head, figures))
        return found

    def indexed_hash(self, chain_id: int, status: IndexerStatus | None) -> str | None:
        """The hash of the block ``chain_id`` is indexed to, as far as this process knows
        without asking the database; None when it must ask."""
        if (status is not None and status.state == "indexing" and status.waiting is None
                and status.indexed_hash):
            return status.indexed_hash
        read = self.read_heads.get(chain_id)
        if read is not None and trio.current_time() - read[0] < self.cache_seconds:
            return read[1]
        return None

    def _read(self, connection: Connection, chains: Sequence[Wanted], address: str
              ) -> dict[int, tuple[str | None, Figures]]:
        """(indexed block hash, figures) per chain. Runs in the database thread."""
        read: dict[int, tuple[str | None, Figures]] = {}
        for chain_id, instance in chains:
            head = indexed_head(connection, chain_id)
            hash_ = head.hash if head is not None else None
            children = self._children(connection, chain_id, instance, hash_)
            read[chain_id] = (hash_, (earned_by_level(connection, chain_id, instance, address),
                                      subtree_by_level(children, address)))
        return read

    def _children(self, connection: Connection, chain_id: int, instance: str,
                  head: str | None) -> Children:
        """The indexed tree of ``instance`` (``indexed_logs.tree_children``), rebuilt only
        when the indexer has moved to another block."""
        if head is None:
            return {}
        key = (chain_id, instance.lower())
        kept = self.trees.get(key)
        if kept is None or kept[0] != head:
            kept = (head, tree_children(connection, chain_id, instance))
            self.trees[key] = kept
        return kept[1]

    def _keep(self, key: tuple[int, str], value: tuple[str, Figures]) -> None:
        self.figures[key] = value
        self.figures.move_to_end(key)
        while len(self.figures) > CACHE_ENTRIES:
            self.figures.popitem(last=False)
