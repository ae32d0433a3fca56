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
from collections.abc import Callable
from pathlib import Path
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
