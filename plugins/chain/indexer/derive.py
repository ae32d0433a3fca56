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

from collections.abc import Iterable

from sqlalchemy import Connection, and_, delete, insert, select, update

from plugins.chain.contracts import DecodedEvent
from plugins.chain.indexer.logs import ROLE_PROTOCOL, ROLE_TREE, Followed, RawLog
from plugins.chain.tables import earnings, logs, positions, token_counters

FEE_BPS = 2_000
BPS = 10_000

Position = tuple[str, str]  # (instance, user address)


def apply(connection: Connection, chain_id: int, followed: Followed, raw: Iterable[RawLog],
          sign: int) -> set[Position]:
    """Apply (``sign`` 1) or take back (-1) what ``raw`` adds; return the positions a
    take-back touched (the caller recomputes them once the logs are gone)."""
    touched: set[Position] = set()
    for log in raw:
        instance, role = followed.by_address.get(log.address, (None, ""))
        event = log.decoded()
        if instance is None or event is None:
            continue
        if role == ROLE_PROTOCOL and event.interface == "FlowProtocol":
            _protocol_event(connection, chain_id, instance, event, sign, touched)
        elif role == ROLE_TREE and event.interface == "PhenomenalTree":
            _tree_event(connection, chain_id, instance, event, sign, touched)
    return touched


def _protocol_event(connection: Connection, chain_id: int, instance: str,
                    event: DecodedEvent, sign: int, touched: set[Position]) -> None:
    args = event.args
    match event.name:
        case "Bought":
            _add_counter(connection, chain_id, instance,
                         fees_usdt=sign * (args["usdtIn"] * FEE_BPS // BPS))
        case "GWTClaimed":
            _add_counter(connection, chain_id, instance, gwt_minted=sign * args["amount"])
        case "RewardPaid":
            _add_earning(connection, chain_id, instance, args["ancestor"].lower(),
                         int(args["levelIndex"]), sign * args["amount"])
        case "Activated":
            user = args["user"].lower()
            if sign > 0:
                _set_position(connection, chain_id, instance, user, activated=True)
            else:
                touched.add((instance, user))


def _tree_event(connection: Connection, chain_id: int, instance: str, event: DecodedEvent,
                sign: int, touched: set[Position]) -> None:
    match event.name:
        case "UserPlaced":
            _add_counter(connection, chain_id, instance, tree_positions=sign)
        case "ActiveUntilSet":
            user = event.args["user"].lower()
            if sign > 0:
                _set_position(connection, chain_id, instance, user,
                              active_until=int(event.args["activeUntil"]))
            else:
                touched.add((instance, user))


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


def _add_earning(connection: Connection, chain_id: int, instance: str, address: str,
                 level: int, amount: int) -> None:
    key = and_(earnings.c.chain_id == chain_id, earnings.c.instance == instance,
               earnings.c.address == address, earnings.c.level == level)
    current = connection.execute(select(earnings.c.amount).where(key)).scalar()
    if current is None:
        connection.execute(insert(earnings).values(chain_id=chain_id, instance=instance,
                                                   address=address, level=level,
                                                   amount=str(amount)))
    else:
        connection.execute(update(earnings).where(key).values(amount=str(int(current) + amount)))


def _set_position(connection: Connection, chain_id: int, instance: str, address: str, *,
                  activated: bool | None = None, active_until: int | None = None) -> None:
    key = and_(positions.c.chain_id == chain_id, positions.c.instance == instance,
               positions.c.address == address)
    row = connection.execute(select(positions).where(key)).first()
    values = {"activated": activated if activated is not None
              else (row.activated if row is not None else False),
              "active_until": active_until if active_until is not None
              else (row.active_until if row is not None else 0)}
    if row is None:
        connection.execute(insert(positions).values(chain_id=chain_id, instance=instance,
                                                    address=address, **values))
    else:
        connection.execute(update(positions).where(key).values(**values))


def recompute_positions(connection: Connection, chain_id: int,
                        touched: Iterable[Position]) -> None:
    """Set each touched position again from the raw logs that remain."""
    for instance, address in touched:
        activated = False
        active_until = 0
        for row in connection.execute(
                select(logs).where(logs.c.chain_id == chain_id, logs.c.instance == instance,
                                   logs.c.account == address,
                                   logs.c.event.in_(("Activated", "ActiveUntilSet")))
                .order_by(logs.c.block_number, logs.c.log_index)):
            event = RawLog.from_row(row).decoded()
            if event is None:
                continue
            if event.name == "Activated":
                activated = True
            else:
                active_until = int(event.args["activeUntil"])
        key = and_(positions.c.chain_id == chain_id, positions.c.instance == instance,
                   positions.c.address == address)
        if not activated and not active_until:
            connection.execute(delete(positions).where(key))
        else:
            _set_position(connection, chain_id, instance, address, activated=activated,
                          active_until=active_until)
