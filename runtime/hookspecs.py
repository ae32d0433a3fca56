"""Every hook of flowsvc, in one place.

Plugins implement these with ``@hookimpl`` (``from runtime.hookspecs import hookimpl``).
Hooks return data; the runtime acts on it (starts actors, mounts blueprints, runs
migrations). A hook marked *may be async* may return an awaitable, which the runtime
awaits; none of them is ``firstresult``, because a coroutine is never None.
``docs/plugins.md`` documents each hook; a test checks that none is missing there.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from quart import Blueprint, Request, Response
    from sqlalchemy import Connection, MetaData

    from runtime.actors import ActorSpec, PartSpec
    from runtime.agents import AgentTemplate, Tool
    from runtime.context import RequestContext
    from runtime.contracts import Provision
    from runtime.contracts.chain import FinalTransfer, TransferWatch
    from runtime.events import EventType, OutboundEvent
    from runtime.hooktypes import Command, PluginConfig, ReadinessCheck
    from runtime.limits import Bucket
    from runtime.principal import Credentials, Principal
    from runtime.retention import RetainedTable
    from runtime.service import Service

hookspec = pluggy.HookspecMarker("flowsvc")
hookimpl = pluggy.HookimplMarker("flowsvc")


# --- Lifecycle and configuration -------------------------------------------------


@hookspec
def flowsvc_plugin_config() -> PluginConfig | None:
    """Declare the plugin's ``[plugins.<name>]`` settings table.

    :return: the plugin name and a frozen pydantic model (a ``runtime.config.Section``)
        whose defaults are the plugin's defaults; unknown keys and bad values stop the
        start with a message naming them. Read the validated settings with
        ``service.plugin_settings(name)``.
    """


@hookspec
def flowsvc_requires() -> list[str] | None:
    """Name the plugins this plugin needs (whose contracts it uses).

    The plugin manager refuses to start when one of them is not enabled, and registers
    this plugin after them, so its actors start after theirs and stop before them.
    ``flowsvc plugins`` shows the graph.

    :return: plugin names, as in ``[plugins] enabled``.
    """


@hookspec
def flowsvc_provides(service: Service) -> list[Provision[Any]] | None:
    """Return the implementations of ``runtime.contracts`` interfaces this plugin provides.

    Consumers get one with ``service.contract(KEY)``; a contract may be provided by one
    plugin only.

    :param service: the service being built (plugin settings are available).
    :return: provisions, each a contract key and the object implementing it.
    """


@hookspec
def flowsvc_tables() -> MetaData | None:
    """Return the ``MetaData`` holding the plugin's tables (used for schema checks).

    :return: the plugin's tables; the schema itself is created by its migrations.
    """


@hookspec
def flowsvc_migrations() -> Path | None:
    """Return the folder of the plugin's Alembic revisions.

    The plugin's first revision carries ``branch_labels = ("<plugin>",)`` and
    ``depends_on = "core"``; ``flowsvc migrate`` upgrades every enabled plugin's branch.

    :return: a folder of revision files, or None for a plugin without tables.
    """


@hookspec
def flowsvc_retained_tables(service: Service) -> list[RetainedTable] | None:
    """Return the plugin's append-only tables whose old rows the ``core.retention`` actor
    drops: partitions on PostgreSQL for a table declared ``partitioned`` (its migration
    made it ``PARTITION BY RANGE`` with a ``<table>_default`` partition), batched deletes
    otherwise (``runtime.retention``).

    :param service: the service being started (for the plugin's retention settings).
    :return: one ``RetainedTable`` per table.
    """


@hookspec
def flowsvc_readiness_checks(service: Service) -> list[ReadinessCheck] | None:
    """Return what ``GET /readyz`` must check besides the database and Redis.

    :param service: the running service.
    :return: named async checks that raise when not ready, or return a detail dict.
    """


@hookspec
def flowsvc_commands() -> list[Command] | None:
    """Return operator commands added to the ``flowsvc`` CLI (``flowsvc access-codes create``).

    :return: commands, each with a name, help, its arguments and an async ``run``.
    """


# --- Actors ----------------------------------------------------------------------


@hookspec
def flowsvc_actors(service: Service) -> list[ActorSpec | PartSpec] | None:
    """Return the long-lived actors the plugin needs; they run as one part of the service,
    under a supervisor of the plugin's own, started in order.

    :param service: the service being started; actors keep what they need from it.
    :return: actor specs with names unique across the service, and nested parts (a
        ``PartSpec`` groups actors that fail and are retried together, such as one chain's).
    """


# --- HTTP ------------------------------------------------------------------------


@hookspec
def flowsvc_blueprints(service: Service) -> list[Blueprint] | None:
    """Return the Quart blueprints holding the plugin's routes.

    :param service: the service the routes will use (available as ``current_service()``).
    :return: blueprints to register on the app.
    """


@hookspec
def flowsvc_authenticate(service: Service, credentials: Credentials, context: RequestContext
                         ) -> Awaitable[Principal | None] | Principal | None:
    """Turn the request's credentials into a caller. *May be async.*

    The first non-None principal wins (the runtime stores it as ``context.principal``).
    Raise ``Unauthenticated`` when a credential the plugin owns is present but invalid
    (an invalid ``x-api-key`` must give 401 even when a valid bearer token comes with it).

    :param service: the running service.
    :param credentials: the API key, bearer token and session cookie of the request.
    :param context: the request's context; keep what later hooks need in a slot of it.
    :return: the caller, or None when this plugin does not own these credentials.
    """


@hookspec
def flowsvc_before_request(service: Service, request: Request, context: RequestContext
                           ) -> Awaitable[None] | None:
    """Check a request before its route runs (rate buckets, spend caps). *May be async.*

    :param service: the running service.
    :param request: the request (route template in ``request.url_rule``).
    :param context: the request's context (``context.principal``: the caller or None).
    :raises ServiceError: to refuse the request (429 ``RateLimited``, 402 ...).
    """


@hookspec
def flowsvc_request_bucket(service: Service, request: Request, context: RequestContext
                           ) -> Bucket | None:
    """Count an anonymous request in a bucket of the plugin's own, or None.

    Only for requests a route of the plugin answers with no API data (the projects
    plugin's previews): the first bucket returned replaces the per-address anonymous one.

    :param service: the running service.
    :param request: the request (route template in ``request.url_rule``).
    :param context: the request's context (``context.client_ip``).
    :return: the bucket (``runtime.limits.Bucket``), or None to count it as usual.
    """


@hookspec
def flowsvc_after_request(service: Service, request: Request, response: Response,
                          context: RequestContext) -> Awaitable[None] | None:
    """Look at a finished request (add headers, log usage). *May be async.* Must not raise.

    :param service: the running service.
    :param request: the request.
    :param response: the response, whose headers may still be changed.
    :param context: the request's context (``context.principal``: the caller or None).
    """


@hookspec
def flowsvc_request_cost(service: Service, route: str, method: str) -> int | None:
    """Return the FLOW cost of a request in micro-FLOW (10^-6 FLOW), or None.

    The costs of all implementations add up. The core prices routes from ``[pricing]``.

    :param service: the running service.
    :param route: the route template, e.g. ``/projects/<slug>/start``.
    :param method: the HTTP method.
    :return: the cost in micro-FLOW, or None when this plugin does not price the route.
    """


# --- Domain ----------------------------------------------------------------------


@hookspec
def flowsvc_webhook_events() -> list[EventType] | None:
    """Declare the webhook event names the plugin emits (the ``GET /me/webhooks/events`` list).

    :return: event types; a name may be declared by one plugin only.
    """


@hookspec
def flowsvc_event_emitted(service: Service, connection: Connection, event: OutboundEvent
                          ) -> None:
    """React to an account event inside the emitter's database transaction.

    Runs synchronously in the database worker thread, on ``connection``: whatever it
    writes commits or rolls back together with the change that caused the event (the
    webhooks plugin's transactional outbox). Use ``runtime.storage.after_commit`` to
    wake an actor once the transaction commits.

    :param service: the running service.
    :param connection: the emitter's open transaction.
    :param event: the event, with its id, name, user id, time and payload.
    """


@hookspec
def flowsvc_user_features(service: Service, user_id: int
                          ) -> Awaitable[dict[str, bool]] | dict[str, bool] | None:
    """Return the feature flags a user has through this plugin. *May be async.*

    Flags from all plugins are OR-ed; the known flags are
    ``runtime.contracts.features.FEATURES``.

    :param service: the running service.
    :param user_id: the user.
    :return: flag names mapped to whether this plugin grants them, or None.
    """


@hookspec
def flowsvc_agent_tools(service: Service) -> list[Tool] | None:
    """Return agent tools the plugin adds to the platform's allowed tool list.

    :param service: the running service.
    :return: tools with names unique across the service.
    """


@hookspec
def flowsvc_agent_templates() -> list[AgentTemplate] | None:
    """Return the agent templates (``agentTemplate`` presets) the plugin provides.

    :return: templates with names unique across the service.
    """


@hookspec
def flowsvc_chain_watches(service: Service) -> list[TransferWatch] | None:
    """Return the token transfers this plugin wants to hear of once final (on-chain payments).

    :param service: the running service.
    :return: watches: a chain, a token and the receiving address.
    """


@hookspec
def flowsvc_chain_transfer(service: Service, connection: Connection, transfer: FinalTransfer
                           ) -> None:
    """React to a final transfer matching a watch, inside the chain indexer's transaction.

    Runs synchronously in the database worker thread, on ``connection``: what it writes
    commits together with the indexer's cursor, so each transfer is handled exactly once.
    It must not raise for a transfer it does not expect (record it instead): raising rolls
    back and stops the indexer of that chain.

    :param service: the running service.
    :param connection: the indexer's open transaction.
    :param transfer: the transfer, with its chain, token, parties, amount and block.
    """


def describe_hooks() -> dict[str, str]:
    """Name and first docstring line of every hook (for ``flowsvc plugins`` and the docs test)."""
    hooks: dict[str, Any] = {name: value for name, value in globals().items()
                             if name.startswith("flowsvc_") and callable(value)}
    return {name: (fn.__doc__ or "").strip().splitlines()[0] for name, fn in hooks.items()}
