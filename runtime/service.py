"""The service: settings, plugins, storage, shared state and actors of one process.

``open_service`` builds everything that needs no running actor (plugin manager, plugin
settings, database, shared state, registries collected from hooks); ``Service.start_actors``
then starts the actors under a supervisor in a nursery the caller owns.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pluggy
import trio
from sqlalchemy import MetaData

from runtime.actors import Registry
from runtime.agents import AgentTemplate, Tool
from runtime.config import ConfigError, Section, Settings, validate_section
from runtime.events import EventType
from runtime.metrics import Metrics
from runtime.plugins import available_plugins, get_plugin_manager
from runtime.shared import SharedState, open_shared_state
from runtime.storage import Database
from runtime.supervisor import Supervisor

S = TypeVar("S", bound=Section)


@dataclass(frozen=True)
class PluginConfig:
    """What ``flowsvc_plugin_config`` returns: the plugin's name and settings model."""

    name: str
    model: type[Section]


@dataclass(frozen=True)
class ReadinessCheck:
    """A named readiness probe; ``check`` raises when not ready or returns details."""

    name: str
    check: Callable[[], Awaitable[dict[str, Any] | None]]


def _unique(kind: str, items: Sequence[Any]) -> dict[str, Any]:
    by_name: dict[str, Any] = {}
    for item in items:
        if item.name in by_name:
            raise ConfigError(f"two plugins declare the {kind} {item.name!r}")
        by_name[item.name] = item
    return by_name


def _flatten(results: list[list[Any] | None]) -> list[Any]:
    return [item for result in results if result for item in result]


class Service:
    """Everything one service process owns. Plugins receive it in their hooks."""

    def __init__(self, settings: Settings, pm: pluggy.PluginManager, db: Database,
                 shared: SharedState, environ: dict[str, str] | None = None) -> None:
        self.settings = settings
        self.pm = pm
        self.db = db
        self.shared = shared
        self.registry = Registry()
        self.metrics = Metrics()
        self.supervisor: Supervisor | None = None
        self._plugin_settings = self._validate_plugin_settings(environ)
        self.event_types: dict[str, EventType] = _unique(
            "webhook event", _flatten(pm.hook.flowsvc_webhook_events()))
        self.templates: dict[str, AgentTemplate] = _unique(
            "agent template", _flatten(pm.hook.flowsvc_agent_templates()))
        self.tools: dict[str, Tool] = _unique(
            "agent tool", _flatten(pm.hook.flowsvc_agent_tools(service=self)))

    def _validate_plugin_settings(self, environ: dict[str, str] | None) -> dict[str, Section]:
        import os

        env = dict(os.environ) if environ is None else environ
        validated: dict[str, Section] = {}
        for config in self.pm.hook.flowsvc_plugin_config():
            if config is None:
                continue
            table = self.settings.plugin_table(config.name)
            validated[config.name] = validate_section(
                config.model, table, ("plugins", config.name), env,
                f"[plugins.{config.name}]")
        enabled = set(self.settings.plugins.enabled)
        known = available_plugins()
        for name in self.settings.plugins.model_extra or {}:
            # A table of a known plugin that is switched off (say by FLOWSVC_PLUGINS_ENABLED)
            # is kept for later; a table naming no plugin at all is most likely a typo.
            if name not in enabled and name not in known:
                raise ConfigError(f"[plugins.{name}] configures no known plugin "
                                  f"(available: {', '.join(sorted(known))})")
        return validated

    def plugin_settings(self, name: str, model: type[S]) -> S:
        """The validated ``[plugins.<name>]`` settings of an enabled plugin."""
        settings = self._plugin_settings[name]
        assert isinstance(settings, model)
        return settings

    def metadata(self) -> list[MetaData]:
        """The ``MetaData`` of the core and every enabled plugin."""
        return [m for m in self.pm.hook.flowsvc_tables() if m is not None]

    def migration_folders(self) -> list[Path]:
        return [p for p in self.pm.hook.flowsvc_migrations() if p is not None]

    async def features(self, user_id: int) -> dict[str, bool]:
        """The user's feature flags, OR-ed over every plugin."""
        flags: dict[str, bool] = {}
        for result in await gather_hook(self.pm.hook.flowsvc_user_features, service=self,
                                        user_id=user_id):
            for name, value in (result or {}).items():
                flags[name] = flags.get(name, False) or bool(value)
        return flags

    async def start_actors(self, nursery: trio.Nursery) -> Supervisor:
        """Start the supervisor and every plugin's actors, in plugin order, in ``nursery``."""
        self.supervisor = Supervisor(nursery, self.settings.supervisor, self.registry,
                                     self.metrics)
        for spec in _flatten(list(reversed(self.pm.hook.flowsvc_actors(service=self)))):
            await self.supervisor.start(spec)
        return self.supervisor


async def gather_hook(hook: Any, **kwargs: Any) -> list[Any]:
    """Call a hook whose implementations may be async; await each awaitable result."""
    results = []
    for result in hook(**kwargs):
        results.append(await result if inspect.isawaitable(result) else result)
    return results


@asynccontextmanager
async def open_service(settings: Settings, *, migrate: bool | None = None,
                       environ: dict[str, str] | None = None) -> AsyncIterator[Service]:
    """Build a service without starting actors or HTTP; close it on exit.

    :param migrate: run migrations first (default: ``database.migrate_on_start``).
    :raises ConfigError: a plugin or a setting is wrong.
    """
    from runtime.migrate import upgrade

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
