"""Hook implementations of the webhooks plugin."""

from __future__ import annotations

from pathlib import Path

from quart import Blueprint
from sqlalchemy import Connection

from plugins.webhooks import routes, tables
from plugins.webhooks.dispatcher import dispatcher_actor, wake_dispatcher
from plugins.webhooks.outbox import fan_out
from plugins.webhooks.settings import WebhooksSettings
from plugins.webhooks.state import WEBHOOKS
from runtime.actors import ActorSpec
from runtime.events import OutboundEvent
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks
from runtime.service import Service
from runtime.storage import after_commit

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "webhooks", WebhooksSettings, tables.metadata, Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    return [dispatcher_actor(service)]


@hookimpl
def flowsvc_event_emitted(service: Service, connection: Connection, event: OutboundEvent) -> None:
    """Write the event to the outbox in the emitter's transaction; wake the dispatcher once
    that transaction commits."""
    if fan_out(connection, event, service.state(WEBHOOKS).settings.max_retries):
        after_commit(connection, lambda: wake_dispatcher(service))
