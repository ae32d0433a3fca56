"""What runs once blocks are final, inside the indexer's transaction (each log exactly once:
it commits with the cursor that moves past it).

- A factory ``Launched`` registers the instance in the token registry (``tokens``) under
  the slug ``<template>-<chainId>-<instance without 0x>``, owned by the deployer, unless the
  registry already names that instance (an operator registered it first). ``dpnm-v2``
  instances are followed but not registered: the registry knows no such template yet.
- ``Sold`` by a user's sign-in address emits ``payout.sent`` with ``payout_id``
  ``"<chainId>:<txHash>:<logIndex>"``, ``tx_hash``, ``amount_flow`` (FLOW sold) and
  ``amount_usdt`` (USDT received), decimal strings with 6 decimals (rounded down), and the
  exact amounts in wei as ``amount_flow_wei`` and ``amount_usdt_wei``.
- Each ERC-20 ``Transfer`` matching a ``flowsvc_chain_watches`` watch goes to
  ``flowsvc_chain_transfer``.
- FLOW balances read at the last final block go to the balance alerts (``alerts``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from sqlalchemy import Connection, select

from plugins.chain import alerts
from plugins.chain.contracts import TEMPLATES, DecodedEvent
from plugins.chain.indexer.logs import RawLog
from plugins.chain.indexer.store import final_logs
from plugins.chain.settings import ChainConfig
from plugins.chain.tables import tokens
from plugins.chain.tokens import upsert_token
from runtime.contracts.chain import FinalTransfer
from runtime.contracts.tokens import TokenTemplate
from runtime.service import Service
from runtime.users import find_user
from runtime.wire import format_flow

log = logging.getLogger("flowsvc.chain.indexer")

PAYOUT_SENT = "payout.sent"
REGISTERED_TEMPLATES: dict[str, TokenTemplate] = {"dpnm": "dpnm", "virtuals": "virtuals"}


@dataclass(frozen=True)
class FinalWork:
    """Blocks ``first..last`` became final; what was read from the node about them."""

    first: int
    last: int
    transfers: Sequence[FinalTransfer] = ()
    balances: Mapping[str, int] = field(default_factory=dict)


def run_final(service: Service, chain: ChainConfig, work: FinalWork,
              connection: Connection) -> None:
    for raw in final_logs(connection, chain.id, work.first, work.last):
        event = raw.event
        if event is None:
            continue
        if event.interface == "LaunchpadFactory" and raw.address == chain.factory:
            _register(connection, chain, event)
        elif event.interface == "FlowProtocol" and event.name == "Sold":
            _payout(service, connection, chain, raw, event)
    for transfer in work.transfers:
        service.pm.hook.flowsvc_chain_transfer(service=service, connection=connection,
                                               transfer=transfer)
    alerts.check_balances(service, connection, chain.id, work.balances)


def token_slug(template: str, chain_id: int, instance: str) -> str:
    return f"{template}-{chain_id}-{instance.lower().removeprefix('0x')}"


def _register(connection: Connection, chain: ChainConfig, event: DecodedEvent) -> None:
    name = TEMPLATES.get(bytes(event.args["id"]))
    instance = event.args["instance"].lower()
    template = REGISTERED_TEMPLATES.get(name or "")
    if template is None:
        log.info("chain %s: instance %s of template %s is not registered (the registry has "
                 "no such template)", chain.name, instance, name)
        return
    known = connection.execute(select(tokens.c.slug).where(
        tokens.c.chain_id == chain.id, tokens.c.instance_address == instance)).scalar()
    if known is not None:
        return
    upsert_token(connection, slug=token_slug(template, chain.id, instance),
                 owner_address=event.args["deployer"], template=template, chain_id=chain.id,
                 instance_address=instance)


def _payout(service: Service, connection: Connection, chain: ChainConfig, raw: RawLog,
            event: DecodedEvent) -> None:
    user = find_user(connection, address=event.args["user"].lower())
    if user is None:
        return
    flow_in, usdt_out = int(event.args["flowIn"]), int(event.args["usdtOut"])
    service.emit_event(connection, user_id=user.id, name=PAYOUT_SENT, data={
        "payout_id": f"{chain.id}:{raw.tx_hash}:{raw.log_index}", "tx_hash": raw.tx_hash,
        "amount_flow": format_flow(flow_in // alerts.WEI_PER_MICRO),
        "amount_usdt": format_flow(usdt_out // alerts.WEI_PER_MICRO),
        "amount_flow_wei": str(flow_in), "amount_usdt_wei": str(usdt_out),
        "chain_id": chain.id, "protocol": raw.address, "block_number": raw.block_number})
