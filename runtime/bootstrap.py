"""Opening a service: the plugin manager, the database, the shared state, the migrations.

``open_service`` is what ``flowsvc serve``, ``flowsvc migrate`` and the plugin commands
run first; it builds everything that needs no running actor, and closes it on exit.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager

from runtime.config import ConfigError, Settings
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
    db = Database(settings.database_url, settings.service.db_threads)
    try:
        async with open_shared_state(settings.redis.url, settings.redis.prefix) as shared:
            service = Service(settings, pm, db, shared, environ)
            if settings.database.migrate_on_start if migrate is None else migrate:
                await upgrade(service)
            yield service
    finally:
        db.dispose()
