"""Migrations: every enabled plugin's branch is applied, repeatable, and matches its tables."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from sqlalchemy import inspect, text

from runtime.bootstrap import open_service
from runtime.config import ConfigError, Settings
from runtime.migrate import upgrade
from runtime.plugins import BUILTIN, available_plugins
from runtime.service import Service
from tests.support.schema import combined_metadata, drift
from tests.support.server import ROOT, make_settings, settings_env

ALL_BUILTIN = [name for name in BUILTIN if name in available_plugins()]


def _env(tmp_path: Path, database_url: str, plugins: list[str]) -> dict[str, str]:
    return settings_env(tmp_path / "var", database_url=database_url,
                        extra={"FLOWSVC_PLUGINS_ENABLED": json.dumps(plugins)})


def _settings(tmp_path: Path, database_url: str, plugins: list[str]) -> Settings:
    return make_settings(_env(tmp_path, database_url, plugins))


def _schema(service: Service) -> tuple[set[str], set[str]]:
    with service.db.engine.connect() as connection:
        tables = set(inspect(connection).get_table_names())
        versions = set(connection.execute(text("SELECT version_num FROM alembic_version"))
                       .scalars())
    return tables, versions


def _drift(service: Service) -> list[Any]:
    with service.db.engine.connect() as connection:
        return drift(connection, service.metadata())


@pytest.mark.parametrize("plugins", [[], ["auth"], ALL_BUILTIN],
                         ids=["core", "core+auth", "all-builtin"])
async def test_migrate_creates_every_enabled_plugins_tables_without_drift(
        tmp_path: Path, database_url: str, plugins: list[str]) -> None:
    async with open_service(_settings(tmp_path, database_url, plugins), migrate=True) as service:
        declared = set(combined_metadata(service.metadata()).tables)
        assert {"users", "idempotency_keys"} <= declared
        assert ("auth_nonces" in declared) == ("auth" in plugins)
        tables, versions = _schema(service)
        assert declared <= tables
        # Heads only: a plugin's head stands for the core revision it depends on.
        assert {version.split("_")[0] for version in versions} <= {"core", *plugins}
        assert _drift(service) == []


async def test_migrate_twice_is_a_no_op(tmp_path: Path, database_url: str) -> None:
    settings = _settings(tmp_path, database_url, ["auth"])
    async with open_service(settings, migrate=True) as service:
        first = _schema(service)
        await upgrade(service)
        assert _schema(service) == first
    async with open_service(settings, migrate=True) as service:
        assert _schema(service) == first


async def test_enabling_a_plugin_later_adds_only_its_branch(tmp_path: Path,
                                                            database_url: str) -> None:
    async with open_service(_settings(tmp_path, database_url, []), migrate=True) as service:
        core_tables, core_versions = _schema(service)
        assert "auth_nonces" not in core_tables
    async with open_service(_settings(tmp_path, database_url, ["auth"]),
                            migrate=True) as service:
        tables, versions = _schema(service)
        assert core_tables < tables and "auth_nonces" in tables
        assert {version.split("_")[0] for version in core_versions} == {"core"}
        assert "auth" in {version.split("_")[0] for version in versions}
        assert _drift(service) == []


def test_replicas_migrating_at_once_on_one_database(tmp_path: Path, database_url: str) -> None:
    """Several ``flowsvc migrate`` processes (replicas with ``migrate_on_start``) at once."""
    env = {**os.environ, **_env(tmp_path, database_url, ["auth"])}
    argv = [sys.executable, "-m", "runtime.cli", "--config", os.devnull, "migrate"]
    processes = [subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)
                 for _ in range(3)]
    outputs = [process.communicate(timeout=60)[0].decode() for process in processes]
    assert [process.returncode for process in processes] == [0, 0, 0], outputs


async def test_services_in_one_process_migrating_at_once(tmp_path: Path,
                                                         database_url: str) -> None:
    settings = _settings(tmp_path, database_url, ["auth"])
    async with open_service(settings, migrate=False) as one, \
            open_service(settings, migrate=False) as two, \
            open_service(settings, migrate=False) as three:
        async with trio.open_nursery() as nursery:
            for service in (one, two, three):
                nursery.start_soon(upgrade, service)
        assert _drift(one) == []


async def test_switching_a_migrated_plugin_off_keeps_its_tables_and_starts(
        tmp_path: Path, database_url: str) -> None:
    async with open_service(_settings(tmp_path, database_url, ["auth", "keys"]),
                            migrate=True) as service:
        with_keys, _ = _schema(service)
    async with open_service(_settings(tmp_path, database_url, ["auth"]),
                            migrate=True) as service:
        tables, versions = _schema(service)
        assert tables == with_keys  # the keys tables stay, untouched
        assert "keys" in {version.split("_")[0] for version in versions}
    async with open_service(_settings(tmp_path, database_url, ["auth", "keys"]),
                            migrate=True) as service:
        assert _drift(service) == []  # and work again when it is switched back on


async def test_revisions_of_a_plugin_nobody_provides_stop_the_start_clearly(
        tmp_path: Path, database_url: str) -> None:
    async with open_service(_settings(tmp_path, database_url, ["auth"]),
                            migrate=True) as service:
        await service.db.write(lambda connection: connection.execute(
            text("INSERT INTO alembic_version (version_num) VALUES ('gone_0001')")))
    with pytest.raises(ConfigError, match="neither enabled nor installed.*gone_0001"):
        async with open_service(_settings(tmp_path, database_url, ["auth"]), migrate=True):
            pass
