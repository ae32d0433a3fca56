"""Hook implementations of the chain plugin: the token registry (its table, routes, command
and the ``TOKENS`` contract), the RPC pools and one indexer per configured chain, the
on-chain read endpoints, FLOW balance alerts and the webhook events the indexer emits.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.chain.commands import TOKENS_COMMAND
from plugins.chain.settings import ChainSettings
from runtime.hookspecs import hookimpl
from runtime.hooktypes import Command
from runtime.plugin_kit import standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint

    from runtime.actors import ActorSpec, PartSpec
    from runtime.contracts import Provision
    from runtime.events import EventType
    from runtime.hooktypes import ReadinessCheck
    from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "chain", ChainSettings, "plugins.chain.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_provides(service: Service) -> list[Provision[Any]]:
    from plugins.chain.tokens import RegisteredTokens
    from runtime.contracts import provision
    from runtime.contracts.tokens import TOKENS

    return [provision(TOKENS, RegisteredTokens())]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec | PartSpec]:
    """The pools' actor, then each chain's indexer in a part of its own (``chain.<name>``):
    a chain that keeps failing (say no RPC URL serves ``eth_getLogs``) is taken down and
    retried later on its own, while the other chains and every route go on."""
    from plugins.chain.indexer.actor import indexer_actor
    from plugins.chain.state import CHAIN, rpc_actor
    from runtime.actors import PartSpec

    return [rpc_actor(service),
            *(PartSpec(f"chain.{chain.name}", (indexer_actor(service, chain),))
              for chain in service.state(CHAIN).chains.values())]


@hookimpl
def flowsvc_readiness_checks(service: Service) -> list[ReadinessCheck]:
    """Ready unless a chain's indexer stopped (a reorg deeper than its finality depth).
    ``process`` is this process's name on the indexers' leases; the chain whose ``state`` is
    ``indexing`` is led by it (every other process says ``standby`` for it)."""
    from plugins.chain.state import CHAIN
    from runtime.hooktypes import ReadinessCheck


    async def indexers() -> dict[str, Any]:
        state = service.state(CHAIN)
        stopped = [f"chain {state.chains[chain_id].name}: {status.stopped_reason}"
                   for chain_id, status in state.indexers.items() if status.state == "stopped"]
        if stopped:
            raise RuntimeError("indexer stopped: " + "; ".join(stopped))
        return {"process": state.owner, "chains": {state.chains[chain_id].name: {
            "state": status.state, "head": status.head, "indexed": status.indexed,
            "final": status.final, "waiting": status.waiting, "unreadable": status.unreadable}
            for chain_id, status in state.indexers.items()}}

    return [ReadinessCheck("chain_indexers", indexers)] if service.state(CHAIN).chains else []


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.chain import alert_routes, routes
    from plugins.chain.onchain import routes as onchain_routes

    return [routes.blueprint, onchain_routes.blueprint, alert_routes.blueprint]


@hookimpl
def flowsvc_commands() -> list[Command]:
    return [TOKENS_COMMAND]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    from runtime.events import EventType

    return [
        EventType("flow.balance.low", "The caller's FLOW balance fell below the threshold they "
                  "set with PUT /me/alerts/flow-balance (balance, threshold, chain_id, "
                  "address); emitted by the chain indexer once the transfer is final."),
        EventType("payout.sent", "The caller's sign-in address sold FLOW on chain (payout_id, "
                  "amount_flow, amount_usdt, tx_hash, ...); emitted by the chain indexer once "
                  "the Sold event is final."),
        EventType("payout.failed", "A payout could not be sent (payout_id, amount_flow, "
                  "reason). Never emitted: the service signs nothing, and a sell that fails "
                  "reverts on chain without an event."),
    ]
