"""The three hooks most plugins write alike, made once: settings, tables and migrations.

A plugin's ``hooks.py`` writes::

    flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
        "keys", KeysSettings, "plugins.keys.tables", Path(__file__).parent / "migrations")

pluggy finds hook implementations by attribute name, so assigning them is enough. The
tables module is named, not imported: it is imported when the tables are first asked for,
so that a command which needs no database (``flowsvc --help``) loads no SQLAlchemy.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from runtime.config import Section
from runtime.hookspecs import hookimpl
from runtime.hooktypes import PluginConfig

if TYPE_CHECKING:
    from sqlalchemy import MetaData


def standard_hooks(name: str, settings: type[Section], tables_module: str, migrations: Path
                   ) -> tuple[Callable[[], PluginConfig], Callable[[], MetaData],
                              Callable[[], Path]]:
    """``flowsvc_plugin_config``, ``flowsvc_tables`` and ``flowsvc_migrations`` of a plugin.

    :param name: the plugin name (its ``[plugins.<name>]`` table).
    :param settings: the model of that table.
    :param tables_module: the dotted name of the module whose ``metadata`` holds its tables.
    :param migrations: the folder of its Alembic revisions.
    """

    @hookimpl
    def flowsvc_plugin_config() -> PluginConfig:
        return PluginConfig(name, settings)

    @hookimpl
    def flowsvc_tables() -> MetaData:
        metadata: MetaData = importlib.import_module(tables_module).metadata
        return metadata

    @hookimpl
    def flowsvc_migrations() -> Path:
        return migrations

    return flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations


def lazy_module(name: str) -> ModuleType:
    """The module ``name``, imported at the first access to one of its attributes.

    For the modules a plugin's per-request hooks use: ``hooks.py`` is loaded by every
    command, ``flowsvc --help`` included, which must not import the web stack; an import
    in the hook's body would cost microseconds on every request, while after its first use
    this module is an ordinary one (the standard library's ``LazyLoader``).
    """
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.find_spec(name)
    if spec is None or spec.loader is None:
        raise ModuleNotFoundError(f"no module named {name!r}", name=name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)  # as an import binds it
    spec.loader.exec_module(module)
    return module
