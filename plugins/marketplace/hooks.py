"""Hook implementations of the marketplace plugin.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from plugins.marketplace.settings import MarketplaceSettings
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint

    from runtime.actors import ActorSpec
    from runtime.events import EventType
    from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "marketplace", MarketplaceSettings, "plugins.marketplace.tables",
    Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_requires() -> list[str]:
    """Runs of agents and agents made from projects use the projects plugin's contracts;
    paid use is charged through the keys plugin's meter."""
    return ["projects", "keys"]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    from plugins.marketplace.publication import AGENT_PUBLISHED

    return [AGENT_PUBLISHED]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.marketplace import routes, usage_routes

    return [routes.blueprint, usage_routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from plugins.marketplace.scheduler import scheduler_actor

    return [scheduler_actor(service)]
