"""Hook implementations of the marketplace plugin."""

from __future__ import annotations

from pathlib import Path

from quart import Blueprint

from plugins.marketplace import routes, tables, usage_routes
from plugins.marketplace.publication import AGENT_PUBLISHED
from plugins.marketplace.scheduler import scheduler_actor
from plugins.marketplace.settings import MarketplaceSettings
from runtime.actors import ActorSpec
from runtime.events import EventType
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks
from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "marketplace", MarketplaceSettings, tables.metadata, Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_requires() -> list[str]:
    """Runs of agents and agents made from projects use the projects plugin's contracts;
    paid use is charged through the keys plugin's meter."""
    return ["projects", "keys"]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    return [AGENT_PUBLISHED]


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [routes.blueprint, usage_routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    return [scheduler_actor(service)]
