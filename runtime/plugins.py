"""The plugin manager factory: built-in plugins by dotted name, third-party by entry point.

No global manager and no work at import time: ``get_plugin_manager`` builds a fresh one
for every service (and every test). The core's own hook implementations
(``runtime.core_hooks``) are essential and always registered; the built-in plugins are
ordinary plugins, enabled by name in ``[plugins] enabled`` exactly like third-party ones,
which install as packages with a ``flowsvc.plugins`` entry point.

A name in ``enabled`` is looked up in that order: a built-in plugin (``auth``), a
``flowsvc.plugins`` entry point (``hello``), then, when it contains a dot, an importable
module path (``mycompany.flowsvc_audit.hooks``) — a plugin that is not packaged, such as
the test plugins under ``tests/support/``.

A plugin names the plugins it needs in ``flowsvc_requires``. The manager refuses to start
when one of them is not enabled, and registers every plugin after the ones it needs
(otherwise in the order of ``enabled``), so actors start after those they use and stop
before them.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import os
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

import pluggy

from runtime import hookspecs
from runtime.config import BUILTIN_PLUGINS, ConfigError

ENTRY_POINT_GROUP = "flowsvc.plugins"
ESSENTIAL = {"core": "runtime.core_hooks"}
BUILTIN = {name: f"plugins.{name}.hooks" for name in BUILTIN_PLUGINS}

log = logging.getLogger("flowsvc.plugins")


def available_plugins() -> dict[str, str]:
    """Every plugin that can be enabled: name to where it comes from."""
    found = {name: module for name, module in BUILTIN.items() if _module_exists(module)}
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(entry_point.name, entry_point.value)
    return found


def _module_exists(dotted: str) -> bool:
    try:
        return importlib.util.find_spec(dotted) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def _load(name: str) -> ModuleType | object:
    if name in BUILTIN and _module_exists(BUILTIN[name]):
        return importlib.import_module(BUILTIN[name])
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        if entry_point.name == name:
            plugin: object = entry_point.load()
            return plugin
    if "." in name and _module_exists(name):
        return importlib.import_module(name)
    known = ", ".join(sorted(available_plugins()))
    raise ConfigError(f"[plugins] enabled: unknown plugin {name!r} (available: {known})")


def requirements(plugin: ModuleType | object) -> list[str]:
    """The plugins ``plugin`` names in its ``flowsvc_requires`` hook (none without one)."""
    declare = getattr(plugin, "flowsvc_requires", None)
    return list(declare() or []) if declare is not None else []


def dependency_order(plugins: dict[str, list[str]]) -> list[str]:
    """The names of ``plugins`` (name to what it requires), each after what it requires,
    otherwise in the given order.

    :raises ConfigError: a required plugin is not among them, or requirements form a circle.
    """
    ordered: list[str] = []
    visiting: list[str] = []

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in visiting:
            circle = " -> ".join([*visiting[visiting.index(name):], name])
            raise ConfigError(f"[plugins] enabled: plugins require each other in a circle: "
                              f"{circle}")
        visiting.append(name)
        for needed in plugins[name]:
            if needed not in plugins:
                raise ConfigError(f"[plugins] enabled: plugin {name!r} requires {needed!r}, "
                                  f"which is not enabled; add {needed!r} to [plugins] enabled")
            visit(needed)
        visiting.pop()
        ordered.append(name)

    for name in plugins:
        visit(name)
    return ordered


def disabled_plugin_migrations(enabled: list[str]) -> list[Path]:
    """The migration folders of the available plugins that are not enabled: their revisions
    stay known, so a database they once migrated still upgrades (``runtime.migrate``)."""
    folders = []
    for name in available_plugins():
        if name in enabled:
            continue
        declare = getattr(_load(name), "flowsvc_migrations", None)
        folder = declare() if declare is not None else None
        if folder is not None:
            folders.append(folder)
    return folders


class FlowsvcPluginManager(pluggy.PluginManager):
    """pluggy's manager, looking for hook implementations only among ``flowsvc_*`` names.

    pluggy inspects every attribute of a plugin module by default; this manager reads only
    the names a hook can have, as pytest's does with ``pytest_*``, so that a module a hooks
    module imports lazily (``runtime.plugin_kit.lazy_module``) stays unloaded until used.
    """

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if not name.startswith("flowsvc_"):
            return None
        return super().parse_hookimpl_opts(plugin, name)


def get_plugin_manager(enabled: list[str]) -> pluggy.PluginManager:
    """A fresh manager with the essential hooks and the ``enabled`` plugins, each
    registered after the plugins it requires.

    :raises ConfigError: a plugin name is unknown or listed twice, or a required plugin
        is not enabled.
    :raises pluggy.PluginValidationError: a plugin implements a hook that does not exist.
    """
    manager = FlowsvcPluginManager("flowsvc")
    manager.add_hookspecs(hookspecs)
    if os.environ.get("FLOWSVC_TRACE_HOOKS"):
        manager.trace.root.setwriter(log.debug)
        manager.enable_tracing()
    for name, module in ESSENTIAL.items():
        manager.register(importlib.import_module(module), name=name)
    loaded: dict[str, ModuleType | object] = {}
    for name in enabled:
        if name in loaded:
            raise ConfigError(f"[plugins] enabled: {name!r} is listed twice")
        loaded[name] = _load(name)
    for name in dependency_order({name: requirements(plugin) for name, plugin in loaded.items()}):
        manager.register(loaded[name], name=name)
    manager.check_pending()
    return manager
