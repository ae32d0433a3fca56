"""Opening a service: the plugin manager, the database, the shared state, the migrations.

``open_service`` is what ``flowsvc serve``, ``flowsvc migrate`` and the plugin commands
run first; it builds everything that needs no running actor, and closes it on exit.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from runtime.config import ConfigError, Settings, check_environment, env_names
from runtime.migrate import upgrade
from runtime.plugins import available_plugins, get_plugin_manager
from runtime.service import Service
from runtime.shared import open_shared_state
from runtime.storage import Database


def check_plugin_tables(settings: Settings) -> None:
    """Refuse a ``[plugins.<name>]`` table that names no plugin at all (most likely a typo).

    The table of a known plugin that is switched off (say by ``FLOWSVC_PLUGINS_ENABLED``)
    is kept for later.

    :raises ConfigError: naming the table and the plugins that exist.
    """
    enabled = set(settings.plugins.enabled)
    known = available_plugins()
    for name in settings.plugins.model_extra or {}:
        if name not in enabled and name not in known:
            raise ConfigError(f"[plugins.{name}] configures no known plugin "
                              f"(available: {', '.join(sorted(known))})")


def check_variables(service: Service, environ: Mapping[str, str]) -> None:
    """Refuse ``FLOWSVC_*`` variables no setting of the core or of an enabled plugin answers
    to (those of available plugins that are switched off are kept for when they are on).

    :raises ConfigError: naming them.
    """
    known = env_names(Settings, ()) | {"FLOWSVC_PRICING"}
    for name, model in service.plugin_models().items():
        known |= env_names(model, ("plugins", name))
    switched_off = {f"FLOWSVC_PLUGINS_{name.upper()}_" for name in available_plugins()
                    if name not in service.settings.plugins.enabled}
    check_environment(environ, known, switched_off)


@asynccontextmanager
async def open_service(settings: Settings, *, migrate: bool | None = None,
                       environ: Mapping[str, str] | None = None) -> AsyncIterator[Service]:
    """Build a service without starting actors or HTTP; close it on exit.

    :param migrate: run migrations first (default: ``database.migrate_on_start``).
    :param environ: where plugin settings overrides are read (default ``os.environ``).
    :raises ConfigError: a plugin or a setting is wrong.
    """
    check_plugin_tables(settings)
    pm = get_plugin_manager(settings.plugins.enabled)
    db = Database(settings.database_url, settings.service.db_threads,
                  timeout=settings.database.timeout_seconds,
                  connect_timeout=settings.database.connect_timeout_seconds)
    try:
        async with open_shared_state(
                settings.redis.url, settings.redis.prefix,
                connect_timeout=settings.redis.connect_timeout_seconds,
                timeout=settings.redis.timeout_seconds) as shared:
            service = Service(settings, pm, db, shared, environ)
            check_variables(service, os.environ if environ is None else environ)
            await service.sandbox.probe()
            if settings.database.migrate_on_start if migrate is None else migrate:
                await upgrade(service)
            yield service
    finally:
        db.dispose()
