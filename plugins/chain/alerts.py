"""FLOW balance alerts: the threshold a user sets, and ``flow.balance.low`` when their FLOW
balance crosses below it.

The balance is the user's sign-in address's FLOW (the ``flow_instance`` of each chain),
read by the indexer at a final block whenever a final FLOW ``Transfer`` moved that address's
balance. Each (user, chain) remembers whether the balance is below the threshold: crossing
below emits once; the balance must rise to the threshold or above before another crossing
emits again. Setting or clearing a threshold forgets that memory, so a user already below a
new threshold hears of it at the next movement of their FLOW.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import Connection, and_, delete, insert, select, update

from plugins.chain.tables import flow_alert_states, flow_alerts
from runtime.service import Service
from runtime.users import users
from runtime.wire import format_flow, utcnow

WEI_PER_MICRO = 10**12  # FLOW has 18 decimals; wire amounts have 6
EVENT = "flow.balance.low"


def get_threshold(connection: Connection, user_id: int) -> int | None:
    """The user's threshold in wei, or None when they set none."""
    value = connection.execute(select(flow_alerts.c.threshold)
                               .where(flow_alerts.c.user_id == user_id)).scalar()
    return int(value) if value is not None else None


def set_threshold(connection: Connection, user_id: int, threshold: int | None) -> None:
    """Set (``threshold`` in wei) or clear (None) the user's threshold."""
    connection.execute(delete(flow_alert_states).where(flow_alert_states.c.user_id == user_id))
    connection.execute(delete(flow_alerts).where(flow_alerts.c.user_id == user_id))
    if threshold is not None:
        connection.execute(insert(flow_alerts).values(user_id=user_id, threshold=str(threshold),
                                                      updated_at=utcnow()))


def alerted_addresses(connection: Connection, addresses: Sequence[str]) -> list[str]:
    """Those of ``addresses`` (lowercase) that belong to a user with a threshold."""
    if not addresses:
        return []
    return list(connection.execute(
        select(users.c.address).join(flow_alerts, flow_alerts.c.user_id == users.c.id)
        .where(users.c.address.in_(list(addresses)))).scalars())


def check_balances(service: Service, connection: Connection, chain_id: int,
                   balances: Mapping[str, int]) -> None:
    """Record each address's FLOW balance on ``chain_id`` against its user's threshold, and
    emit ``flow.balance.low`` for each that crossed below it."""
    for address, balance in sorted(balances.items()):
        row = connection.execute(
            select(users.c.id, flow_alerts.c.threshold)
            .join(flow_alerts, flow_alerts.c.user_id == users.c.id)
            .where(users.c.address == address)).first()
        if row is None:
            continue
        threshold = int(row.threshold)
        key = and_(flow_alert_states.c.user_id == row.id, flow_alert_states.c.chain_id == chain_id)
        was_below = connection.execute(select(flow_alert_states.c.below).where(key)).scalar()
        below = balance < threshold
        if was_below is None:
            connection.execute(insert(flow_alert_states).values(user_id=row.id,
                                                                chain_id=chain_id, below=below))
        elif was_below != below:
            connection.execute(update(flow_alert_states).where(key).values(below=below))
        if below and not was_below:
            service.emit_event(connection, user_id=row.id, name=EVENT, data={
                "balance": format_flow(balance // WEI_PER_MICRO),
                "threshold": format_flow(threshold // WEI_PER_MICRO),
                "chain_id": chain_id, "address": address})
