"""Hook implementations of the webhooks plugin.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from plugins.webhooks.settings import WebhooksSettings
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint
    from sqlalchemy import Connection

    from runtime.actors import ActorSpec
    from runtime.events import OutboundEvent
    from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "webhooks", WebhooksSettings, "plugins.webhooks.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.webhooks import routes

    return [routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from plugins.webhooks.dispatcher import dispatcher_actor

    return [dispatcher_actor(service)]


@hookimpl
def flowsvc_event_emitted(service: Service, connection: Connection, event: OutboundEvent) -> None:
    """Write the event to the outbox in the emitter's transaction; wake the dispatcher once
    that transaction commits."""
    from plugins.webhooks.dispatcher import wake_dispatcher
    from plugins.webhooks.outbox import fan_out
    from plugins.webhooks.state import WEBHOOKS
    from runtime.storage import after_commit

    if fan_out(connection, event, service.state(WEBHOOKS).settings.max_retries):
        after_commit(connection, lambda: wake_dispatcher(service))
