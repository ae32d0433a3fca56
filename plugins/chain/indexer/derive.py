"""What each followed log adds to the derived tables, and how a reorg takes it back.

Sums move by deltas and roll back by the inverse delta (``sign`` -1):
- ``UserPlaced`` (tree): ``totalTreePositions`` + 1 (the root's placement counts).
- ``Bought``: ``lifetimeFeesUsdt`` + the 20% fee of the gross, ``usdtIn * 2000 // 10000``,
  rounded down as the contract rounds it.
- ``GWTClaimed``: ``lifetimeGwtMinted`` + the amount (claiming is the only mint of GWT).
- ``RewardPaid``: the ancestor's earnings at ``levelIndex`` + the amount.

Positions are values set, not sums: ``Activated`` (protocol) marks a user activated and
``ActiveUntilSet`` (tree; ``TreeExtended`` carries the same value) sets when their tree
activity ends. Going forward the newest log wins; after a rollback each touched position is
recomputed from the raw logs that remain (as rindexer recomputes a max).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, delete, insert, select, update

from plugins.chain.contracts import DecodedEvent
from plugins.chain.indexer import logs as raw_logs
from plugins.chain.indexer.bulk import insert_rows
from plugins.chain.indexer.logs import Followed, RawLog
from plugins.chain.tables import POSITION_LOGS, earnings, logs, positions, token_counters

FEE_BPS = 2_000
BPS = 10_000

Position = tuple[str, str]  # (instance, user address)
EARNINGS_KEY = ("chain_id", "instance", "address", "level")
EARNINGS_COLUMNS = (*EARNINGS_KEY, "amount")
POSITIONS_KEY = ("chain_id", "instance", "address")
POSITIONS_COLUMNS = (*POSITIONS_KEY, "activated", "active_until")


@dataclass
class Deltas:
    """What a batch of logs changes, summed per row, so each row is written once."""

    counters: defaultdict[str, list[int]] = field(
        default_factory=lambda: defaultdict(lambda: [0, 0, 0]))  # tree, fees, gwt
    earnings: defaultdict[tuple[str, str, int], int] = field(
        default_factory=lambda: defaultdict(int))
    positions: dict[Position, dict[str, Any]] = field(default_factory=dict)
    touched: set[Position] = field(default_factory=set)

    def add(self, instance: str, role: str, event: DecodedEvent, sign: int) -> None:
        args = event.args
        match (role, event.interface, event.name):
            case (raw_logs.ROLE_TREE, "PhenomenalTree", "UserPlaced"):
                self.counters[instance][0] += sign
            case (raw_logs.ROLE_PROTOCOL, "FlowProtocol", "Bought"):
                self.counters[instance][1] += sign * (args["usdtIn"] * FEE_BPS // BPS)
            case (raw_logs.ROLE_PROTOCOL, "FlowProtocol", "GWTClaimed"):
                self.counters[instance][2] += sign * args["amount"]
            case (raw_logs.ROLE_PROTOCOL, "FlowProtocol", "RewardPaid"):
                self.earnings[(instance, args["ancestor"].lower(), int(args["levelIndex"]))] \
                    += sign * args["amount"]
            case (raw_logs.ROLE_PROTOCOL, "FlowProtocol", "Activated"):
                self._set(instance, args["user"], sign, activated=True)
            case (raw_logs.ROLE_TREE, "PhenomenalTree", "ActiveUntilSet"):
                self._set(instance, args["user"], sign, active_until=int(args["activeUntil"]))

    def _set(self, instance: str, user: str, sign: int, **values: Any) -> None:
        position = (instance, user.lower())
        if sign > 0:
            self.positions.setdefault(position, {}).update(values)  # the newest log wins
        else:
            self.touched.add(position)


def apply(connection: Connection, chain_id: int, followed: Followed, raw: Iterable[RawLog],
          sign: int) -> set[Position]:
    """Apply (``sign`` 1) or take back (-1) what ``raw`` adds; return the positions a
    take-back touched (the caller recomputes them once the logs are gone)."""
    return write(connection, chain_id, deltas_of(followed, raw, sign))


def deltas_of(followed: Followed, raw: Iterable[RawLog], sign: int) -> Deltas:
    """What ``raw`` adds (``sign`` 1) or takes back (-1), summed per row: no database work,
    so the indexer sums a range while the range before it is being written."""
    deltas = Deltas()
    for log in raw:
        instance, role = followed.by_address.get(log.address, (None, ""))
        if instance is not None and log.event is not None:
            deltas.add(instance, role, log.event, sign)
    return deltas


def write(connection: Connection, chain_id: int, deltas: Deltas) -> set[Position]:
    """Write ``deltas``, each row once; return the positions a take-back touched."""
    for instance, (tree_positions, fees_usdt, gwt_minted) in deltas.counters.items():
        _add_counter(connection, chain_id, instance, tree_positions=tree_positions,
                     fees_usdt=fees_usdt, gwt_minted=gwt_minted)
    _add_earnings(connection, chain_id, deltas.earnings)
    _set_positions(connection, chain_id, deltas.positions)
    return deltas.touched


def _add_counter(connection: Connection, chain_id: int, instance: str, *,
                 tree_positions: int = 0, fees_usdt: int = 0, gwt_minted: int = 0) -> None:
    key = and_(token_counters.c.chain_id == chain_id, token_counters.c.instance == instance)
    row = connection.execute(select(token_counters).where(key)).first()
    if row is None:
        connection.execute(insert(token_counters).values(
            chain_id=chain_id, instance=instance, tree_positions=tree_positions,
            fees_usdt=str(fees_usdt), gwt_minted=str(gwt_minted)))
        return
    connection.execute(update(token_counters).where(key).values(
        tree_positions=row.tree_positions + tree_positions,
        fees_usdt=str(int(row.fees_usdt) + fees_usdt),
        gwt_minted=str(int(row.gwt_minted) + gwt_minted)))


def _add_earnings(connection: Connection, chain_id: int,
                  amounts: Mapping[tuple[str, str, int], int]) -> None:
    """Add each amount to its (instance, address, level) row: the rows are read in one query
    and written by one multi-row upsert (``bulk``)."""
    if not amounts:
        return
    current = {(row.instance, row.address, row.level): int(row.amount)
               for row in connection.execute(select(earnings).where(
                   earnings.c.chain_id == chain_id,
                   earnings.c.instance.in_(sorted({key[0] for key in amounts})),
                   earnings.c.address.in_(sorted({key[1] for key in amounts}))))}
    insert_rows(connection, earnings.name, EARNINGS_COLUMNS, [
        (chain_id, instance, address, level, str(current.get((instance, address, level), 0)
                                                 + amount))
        for (instance, address, level), amount in amounts.items()], upsert_keys=EARNINGS_KEY)


def _set_positions(connection: Connection, chain_id: int,
                   values: Mapping[Position, Mapping[str, Any]]) -> None:
    """Set the given fields of each position (one query to read, one upsert to write)."""
    if not values:
        return
    current = {(row.instance, row.address): row for row in connection.execute(
        select(positions).where(
            positions.c.chain_id == chain_id,
            positions.c.instance.in_(sorted({key[0] for key in values})),
            positions.c.address.in_(sorted({key[1] for key in values}))))}
    rows = []
    for (instance, address), fields in values.items():
        row = current.get((instance, address))
        rows.append((chain_id, instance, address,
                     fields.get("activated", row.activated if row else False),
                     fields.get("active_until", row.active_until if row else 0)))
    insert_rows(connection, positions.name, POSITIONS_COLUMNS, rows, upsert_keys=POSITIONS_KEY)


def recompute_positions(connection: Connection, chain_id: int,
                        touched: Iterable[Position]) -> None:
    """Set each touched position again from the raw logs that remain."""
    for instance, address in touched:
        activated = False
        active_until = 0
        for row in connection.execute(
                select(logs).where(logs.c.chain_id == chain_id, POSITION_LOGS,
                                   logs.c.instance == instance, logs.c.account == address,
                                   logs.c.event.in_(("Activated", "ActiveUntilSet")))
                .order_by(logs.c.block_number, logs.c.log_index)):
            event = RawLog.from_row(row).event
            if event is None:
                continue
            if event.name == "Activated":
                activated = True
            else:
                active_until = int(event.args["activeUntil"])
        if activated or active_until:
            _set_positions(connection, chain_id, {(instance, address): {
                "activated": activated, "active_until": active_until}})
        else:
            connection.execute(delete(positions).where(
                positions.c.chain_id == chain_id, positions.c.instance == instance,
                positions.c.address == address))
