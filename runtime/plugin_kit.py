"""The three hooks most plugins write alike, made once: settings, tables and migrations.

A plugin's ``hooks.py`` writes::

    flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
        "keys", KeysSettings, tables.metadata, Path(__file__).parent / "migrations")

pluggy finds hook implementations by attribute name, so assigning them is enough.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sqlalchemy import MetaData

from runtime.config import Section
from runtime.hookspecs import hookimpl
from runtime.hooktypes import PluginConfig


def standard_hooks(name: str, settings: type[Section], metadata: MetaData, migrations: Path
                   ) -> tuple[Callable[[], PluginConfig], Callable[[], MetaData],
                              Callable[[], Path]]:
    """``flowsvc_plugin_config``, ``flowsvc_tables`` and ``flowsvc_migrations`` of a plugin.

    :param name: the plugin name (its ``[plugins.<name>]`` table).
    :param settings: the model of that table.
    :param metadata: the plugin's tables.
    :param migrations: the folder of its Alembic revisions.
    """

    @hookimpl
    def flowsvc_plugin_config() -> PluginConfig:
        return PluginConfig(name, settings)

    @hookimpl
    def flowsvc_tables() -> MetaData:
        return metadata

    @hookimpl
    def flowsvc_migrations() -> Path:
        return migrations

    return flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations
