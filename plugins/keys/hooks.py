"""Hook implementations of the keys plugin.

Only the settings are imported with this module; each hook imports what it uses, so that
``flowsvc --help``, which loads every plugin's hooks for their commands, loads no web stack.
"""

from __future__ import annotations

from collections.abc import Awaitable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from plugins.keys.settings import KeysSettings
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import lazy_module, standard_hooks

if TYPE_CHECKING:
    from quart import Blueprint, Request, Response

    from plugins.keys import pipeline
    from runtime.actors import ActorSpec
    from runtime.context import RequestContext
    from runtime.hooktypes import ReadinessCheck
    from runtime.principal import Credentials, Principal
    from runtime.retention import RetainedTable
    from runtime.service import Service
else:
    pipeline = lazy_module("plugins.keys.pipeline")  # the request hooks' (see lazy_module)

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "keys", KeysSettings, "plugins.keys.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.keys import activity, rotation, routes

    return [routes.blueprint, rotation.blueprint, activity.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from plugins.keys.charging import charges_actor
    from plugins.keys.directory import directory_actor
    from plugins.keys.meter import meter_actor
    from plugins.keys.state import KEYS
    from plugins.keys.usage import usage_actor

    state = service.state(KEYS)
    settings = state.settings
    return [
        directory_actor(state.directory, service.db, service.shared,
                        settings.invalidation_poll_seconds),
        meter_actor(state),
        charges_actor(state, embedded=service.shared.redis is None,
                      shared_lock=service.shared.lock),
        usage_actor(service.db, state.usage, batch=settings.usage_batch,
                    flush_seconds=settings.usage_flush_seconds),
    ]


@hookimpl
def flowsvc_retained_tables(service: Service) -> list[RetainedTable]:
    from plugins.keys.state import KEYS
    from plugins.keys.tables import api_key_usage, api_key_usage_rollups
    from runtime.retention import RetainedTable

    # The rollups go with the log's days (the same cutoff), so "all" counts what the log holds.
    days = service.state(KEYS).settings.usage_retention_days
    return [RetainedTable(api_key_usage, "at", days),
            RetainedTable(api_key_usage_rollups, "bucket_start", days, partitioned=False)]


@hookimpl
def flowsvc_readiness_checks(service: Service) -> list[ReadinessCheck]:
    from plugins.keys.state import KEYS
    from runtime.hooktypes import ReadinessCheck

    usage = service.state(KEYS).usage

    async def usage_log() -> dict[str, Any]:
        return usage.status()

    return [ReadinessCheck("keys.usage", usage_log)]


# The request hooks are plain functions that return an awaitable only when there is
# something to wait for: most requests carry no key, and a known key needs no I/O.


@hookimpl
def flowsvc_authenticate(service: Service, credentials: Credentials, context: RequestContext
                         ) -> Principal | None | Awaitable[Principal | None]:
    return pipeline.authenticate(service, credentials, context)


@hookimpl
def flowsvc_before_request(service: Service, request: Request,
                           context: RequestContext) -> Awaitable[None] | None:
    principal = context.principal
    call = context.get(pipeline.KEY_CALL)
    if principal is not None and principal.via == "api_key" and call is not None:
        return pipeline.admit(service, request, call)
    return None


@hookimpl
def flowsvc_after_request(service: Service, request: Request, response: Response,
                          context: RequestContext) -> Awaitable[None] | None:
    return pipeline.finish(service, request, response, context)
