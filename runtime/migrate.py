"""Schema migrations with Alembic: the core branch plus one branch per enabled plugin.

Each plugin ships its revisions in its own folder (``flowsvc_migrations``), labelled with
its name and depending on the core branch, so enabling a plugin later only adds its
branch. ``flowsvc migrate`` and the embedded ``serve`` upgrade every head.

A plugin switched off after its tables were made keeps its migration history: the
revisions of every available plugin are known to Alembic, and only the enabled plugins'
branches are upgraded, so the switched-off plugin's tables stay as they are until it is
enabled again. A database holding revisions nobody can provide any more (an uninstalled
third-party plugin) stops the start with a message naming the revision and what to do.

Several replicas may start together with ``migrate_on_start``: upgrades are serialised
(a lock in the process, because Alembic keeps the running command in module globals; a
PostgreSQL advisory lock, or SQLite's write lock, between processes), so the first one
migrates and the others find nothing left to do.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from alembic.util import CommandError
from sqlalchemy import Connection, text

from runtime.config import ConfigError
from runtime.plugins import disabled_plugin_migrations

if TYPE_CHECKING:
    from runtime.service import Service

HERE = Path(__file__).parent / "migrations"
_IN_PROCESS = threading.Lock()
_ADVISORY_LOCK_CLASS = int.from_bytes(b"flow", "big") >> 1  # any fixed int4
_MIGRATION_LOCK_WAIT_MS = 600_000


def alembic_config(service: Service) -> Config:
    """An Alembic config for the service's database and every available plugin's revisions
    (no alembic.ini)."""
    config = Config()
    config.set_main_option("script_location", str(HERE))
    config.set_main_option("path_separator", "os")
    # The core's own revisions are plugin-provided too (runtime.core_hooks), like any branch.
    folders = [*service.migration_folders(),
               *disabled_plugin_migrations(service.settings.plugins.enabled)]
    config.set_main_option("version_locations", os.pathsep.join(str(f) for f in folders))
    config.set_main_option("sqlalchemy.url", service.db.url.replace("%", "%%"))
    return config


def upgrade_sync(service: Service) -> None:
    """Upgrade every head in one transaction, one process and one caller at a time."""
    config = alembic_config(service)
    # On SQLite the transaction itself is the lock: it begins IMMEDIATE (runtime.storage).
    with _IN_PROCESS, service.db.engine.connect() as connection, \
            _without_deadline(connection, service.db.timeout):
        if connection.dialect.name == "postgresql":
            # A migration may wait for the lock, and rewrite a large table, far longer than
            # one request's database.timeout_seconds.
            connection.execute(text("SET LOCAL statement_timeout = 0"))
            # Per schema: services in other schemas of the database migrate independently.
            connection.execute(text("SELECT pg_advisory_xact_lock(:class, "
                                    "hashtext(current_schema()))"),
                               {"class": _ADVISORY_LOCK_CLASS})
        config.attributes["connection"] = connection
        enabled = {folder.resolve() for folder in service.migration_folders()}
        # Each enabled folder is one branch, labelled by its first revision (core, auth, ...).
        branches = sorted({label for script in ScriptDirectory.from_config(config)
                           .walk_revisions() if Path(script.path).parent.resolve() in enabled
                           for label in script.branch_labels})
        try:
            for branch in branches:
                command.upgrade(config, f"{branch}@head")
        except CommandError as exc:
            if "Can't locate revision" not in str(exc):
                raise
            raise ConfigError(
                f"the database was migrated by a plugin that is neither enabled nor installed "
                f"now ({exc}); install and enable it again, or restore a database without it"
            ) from None


@contextmanager
def _without_deadline(connection: Connection, timeout: float) -> Iterator[None]:
    """One transaction on ``connection``; on SQLite it waits for the write lock as long as
    another migration holds it (the busy timeout is put back afterwards). The pragma goes
    to the driver's connection: through SQLAlchemy it would begin the transaction first."""
    sqlite = connection.dialect.name == "sqlite"
    driver: Any = connection.connection.driver_connection
    if sqlite:
        driver.execute(f"PRAGMA busy_timeout={_MIGRATION_LOCK_WAIT_MS}")
    try:
        with connection.begin():
            yield
    finally:
        if sqlite:
            driver.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")


async def upgrade(service: Service) -> None:
    """Bring the schema to the newest revision of every enabled branch."""
    import trio

    # Migrations are rare and serialised; a plain thread keeps the Trio thread free.
    await trio.to_thread.run_sync(upgrade_sync, service)
