"""Hook implementations of the billing plugin.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from plugins.billing.settings import BillingSettings
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint
    from sqlalchemy import Connection

    from runtime.actors import ActorSpec
    from runtime.contracts.chain import FinalTransfer, TransferWatch
    from runtime.events import EventType
    from runtime.service import Service

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "billing", BillingSettings, "plugins.billing.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_requires() -> list[str]:
    return ["auth", "chain"]  # the messenger (renewal invoices), final USDT transfers


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.billing import callbacks, routes

    return [routes.blueprint, callbacks.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from plugins.billing.scheduler import scheduler_actor
    from plugins.billing.state import BILLING

    return [scheduler_actor(service, service.state(BILLING))]


@hookimpl
def flowsvc_webhook_events() -> list[EventType]:
    from plugins.billing.events import EVENT_TYPES

    return EVENT_TYPES


@hookimpl
async def flowsvc_user_features(service: Service, user_id: int) -> dict[str, bool]:
    """Read on every call (no cache), so a change is seen at once by every process."""
    from plugins.billing import subscriptions
    from plugins.billing.state import BILLING
    from plugins.billing.tiers import features

    subscription = await service.db.read(subscriptions.live, user_id)
    now = service.state(BILLING).clock.now()
    return features(subscription.live_tier(now) if subscription is not None else None)


@hookimpl
def flowsvc_chain_watches(service: Service) -> list[TransferWatch]:
    from plugins.billing import chain

    return chain.watches(service)


@hookimpl
def flowsvc_chain_transfer(service: Service, connection: Connection,
                           transfer: FinalTransfer) -> None:
    from plugins.billing import chain

    chain.on_transfer(service, connection, transfer)
