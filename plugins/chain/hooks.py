"""Hook implementations of the chain plugin: the token registry (its table, routes, command
and the ``TOKENS`` contract), the RPC pools of the configured chains and its webhook event
declaration."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from quart import Blueprint

from plugins.chain import routes, tables
from plugins.chain.commands import TOKENS_COMMAND
from plugins.chain.onchain import routes as onchain_routes
from plugins.chain.settings import ChainSettings
from plugins.chain.state import rpc_actor
from plugins.chain.tokens import RegisteredTokens
from runtime.actors import ActorSpec
from runtime.contracts import Provision, provision
from runtime.contracts.tokens import TOKENS
from runtime.events import EventType
from runtime.hookspecs import hookimpl
from runtime.hooktypes import Command
from runtime.plugin_kit import standard_hooks
from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "chain", ChainSettings, tables.metadata, Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_provides(service: Service) -> list[Provision[Any]]:
    return [provision(TOKENS, RegisteredTokens())]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    return [rpc_actor(service)]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [routes.blueprint, onchain_routes.blueprint]


@hookimpl
def flowsvc_commands() -> list[Command]:
    return [TOKENS_COMMAND]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [
        EventType("flow.balance.low", "The caller's FLOW balance fell below their threshold "
                  "(balance, threshold)."),
    ]
