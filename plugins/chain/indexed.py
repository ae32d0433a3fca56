"""What the indexer built, for the read endpoints: per-token counters, a user's earnings by
tree level, how far a chain is indexed and the tokens it could not read. Sync functions on
an open connection (call them through ``service.db.read``); amounts are wei as ints, zeros
while nothing is indexed.

``total_active_positions`` counts the users of the token who called ``activate()`` and
whose tree activity (the newest ``ActiveUntilSet``/``TreeExtended`` of the tree) ends after
the time of the newest indexed block: "activated and tree not expired", judged at the
chain's time rather than the server's clock.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, func, select

from plugins.chain.tables import cursors, earnings, positions, unreadable_tokens
from plugins.chain.tables import token_counters as counters

LEVELS = 10


@dataclass(frozen=True)
class TokenCounters:
    total_active_positions: int
    total_tree_positions: int
    lifetime_fees_usdt: int
    lifetime_gwt_minted: int


@dataclass(frozen=True)
class IndexedHead:
    """The newest indexed block of a chain and the newest block the indexer holds final
    (None before the first final block)."""

    number: int
    hash: str
    time: int
    final_number: int | None


def indexed_head(connection: Connection, chain_id: int) -> IndexedHead | None:
    """How far ``chain_id`` is indexed; None before its first indexed block."""
    row = connection.execute(select(cursors).where(cursors.c.chain_id == chain_id)).first()
    if row is None or row.block_number is None:
        return None
    return IndexedHead(row.block_number, row.block_hash, row.block_time, row.final_number)


def unreadable_reason(connection: Connection, chain_id: int, instance: str) -> str | None:
    """Why the indexer could not read the token at ``instance`` (not a dpnm instance), or
    None when it could (or has not looked yet)."""
    return connection.execute(
        select(unreadable_tokens.c.reason).where(unreadable_tokens.c.chain_id == chain_id,
                                                 unreadable_tokens.c.instance == instance.lower())
    ).scalar()


def token_counters(connection: Connection, chain_id: int, instance: str) -> TokenCounters:
    """The indexed counters of the dpnm token at ``instance`` (any case)."""
    instance = instance.lower()
    row = connection.execute(
        select(counters).where(counters.c.chain_id == chain_id,
                               counters.c.instance == instance)).first()
    head = indexed_head(connection, chain_id)
    active = 0
    if head is not None:
        active = connection.execute(
            select(func.count()).select_from(positions)
            .where(positions.c.chain_id == chain_id, positions.c.instance == instance,
                   positions.c.activated.is_(True), positions.c.active_until > head.time)
        ).scalar_one()
    if row is None:
        return TokenCounters(active, 0, 0, 0)
    return TokenCounters(active, row.tree_positions, int(row.fees_usdt), int(row.gwt_minted))


def earned_by_level(connection: Connection, chain_id: int, instance: str,
                    address: str) -> list[int]:
    """What ``address`` earned from ``RewardPaid`` of the token at ``instance``, by tree
    level: ten amounts in wei, index 0 is level 1 (the contract's ``levelIndex`` 0). Their
    sum is the user's ``lifetimeIncome``."""
    by_level = [0] * LEVELS
    for level, amount in connection.execute(
            select(earnings.c.level, earnings.c.amount)
            .where(earnings.c.chain_id == chain_id, earnings.c.instance == instance.lower(),
                   earnings.c.address == address.lower())):
        if 0 <= level < LEVELS:
            by_level[level] = int(amount)
    return by_level
