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

from alembic.config import Config
from alembic.runtime.environment import EnvironmentContext
from alembic.runtime.migration import MigrationContext, MigrationStep
from alembic.script import ScriptDirectory
from alembic.script.revision import ResolutionError
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
        scripts = ScriptDirectory.from_config(config)
        enabled = {folder.resolve() for folder in service.migration_folders()}
        # Each enabled folder is one branch, labelled by its first revision (core, auth, ...).
        branches = {label for script in scripts.walk_revisions()
                    if Path(script.path).parent.resolve() in enabled
                    for label in script.branch_labels}
        try:
            _upgrade_to(config, scripts, _outermost_heads(scripts, branches))
        except ResolutionError as exc:  # a revision of the database that no folder holds
            raise ConfigError(
                f"the database was migrated by a plugin that is neither enabled nor installed "
                f"now ({exc}); install and enable it again, or restore a database without it"
            ) from None


def _outermost_heads(scripts: ScriptDirectory, branches: set[str]) -> tuple[str, ...]:
    """The head revisions of ``branches`` that no other of these heads requires: upgrading
    to them upgrades every branch (Alembic refuses targets that overlap, such as
    ``core@head`` beside ``auth@head`` when auth depends on it)."""
    heads = {branch: _head(scripts, branch) for branch in sorted(branches)}
    required = {script.revision for head in heads.values()
                for script in scripts.iterate_revisions(head, "base") if script.revision != head}
    return tuple(head for head in heads.values() if head not in required)


def _head(scripts: ScriptDirectory, branch: str) -> str:
    script = scripts.get_revision(f"{branch}@head")
    assert script is not None, branch  # every branch label names at least one revision
    return script.revision


def _upgrade_to(config: Config, scripts: ScriptDirectory, heads: tuple[str, ...]) -> None:
    """Upgrade to all of ``heads`` in one Alembic run, as ``alembic upgrade`` does for one
    target: the revision files are read once (``command.upgrade`` takes one target and reads
    them all again each time, about 0.1 s of CPU per branch).

    :raises ResolutionError: a revision of the database cannot be located.
    """
    def steps(current: tuple[str, ...], context: MigrationContext) -> list[MigrationStep]:
        revisions = scripts.iterate_revisions(heads, current, implicit_base=True)
        return [MigrationStep.upgrade_from_script(scripts.revision_map, revision)
                for revision in reversed(list(revisions))]

    with EnvironmentContext(config, scripts, fn=steps):
        scripts.run_env()


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
