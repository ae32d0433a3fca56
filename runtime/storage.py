"""Storage: SQLAlchemy 2 Core over SQLite (embedded default) or PostgreSQL (psycopg 3).

Blocking database calls never run on the Trio thread: ``Database.write`` and
``Database.read`` run a plain function in a worker thread, limited by a small
``trio.CapacityLimiter`` (``service.db_threads``, 4 by default; more threads only fight
over the GIL, see ``docs/performance.md``). A write function gets a connection inside
one transaction; everything it does commits together or not at all, which is what the
webhook outbox relies on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.exc import DBAPIError, OperationalError

from runtime.errors import Unavailable

T = TypeVar("T")
log = logging.getLogger("flowsvc.storage")
AFTER_COMMIT = "flowsvc_after_commit"


def normalize_url(url: str) -> str:
    """Use psycopg 3 for every PostgreSQL URL (``postgresql://`` means psycopg2 in SQLAlchemy)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def make_engine(url: str, pool_size: int) -> Engine:
    """An engine with the settings each backend needs to be safe under concurrency."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30},
                               pool_size=pool_size, max_overflow=0)
        event.listen(engine, "connect", _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    return create_engine(url, pool_size=pool_size, max_overflow=2, pool_pre_ping=True)


def _sqlite_on_connect(dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite so that we can BEGIN IMMEDIATE:
    # a deferred transaction that later writes can fail with "database is locked"
    # without waiting, which busy_timeout does not cover.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA busy_timeout=30000")
    cursor.close()


def _sqlite_on_begin(connection: Connection) -> None:
    write = connection.get_execution_options().get("flowsvc_write", True)
    connection.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def after_commit(connection: Connection, callback: Callable[[], None]) -> None:
    """Run ``callback`` on the Trio thread once the transaction of ``connection`` commits.

    Used to wake actors (a dispatcher, a broadcaster) about rows that only become
    visible after the commit. Callbacks must be quick and must not raise.
    """
    connection.info.setdefault(AFTER_COMMIT, []).append(callback)


class Database:
    """One engine and the thread limiter its calls go through.

    :param url: a SQLAlchemy URL; ``postgresql://`` is routed to psycopg 3.
    :param threads: how many database calls may run at once.
    """

    def __init__(self, url: str, threads: int) -> None:
        self.url = normalize_url(url)
        self.engine = make_engine(self.url, pool_size=threads)
        self.limiter = trio.CapacityLimiter(threads)

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in one transaction in a worker thread.

        :raises Unavailable: the database cannot be reached.
        """
        callbacks: list[Callable[[], None]] = []
        result = await self._in_thread(partial(self._write_sync, fn, callbacks), *args)
        for callback in callbacks:
            callback()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in a read-only transaction in a worker thread."""
        return await self._in_thread(self._read_sync, fn, *args)

    async def ping(self) -> None:
        """Check the database answers.

        :raises Unavailable: it does not.
        """
        await self.read(lambda connection: connection.execute(text("SELECT 1")).scalar())

    def dispose(self) -> None:
        self.engine.dispose()

    def _write_sync(self, fn: Callable[..., T], callbacks: list[Callable[[], None]],
                    *args: Any) -> T:
        with self.engine.connect() as connection:
            connection.info.pop(AFTER_COMMIT, None)
            with connection.begin():
                result = fn(connection, *args)
            callbacks.extend(connection.info.pop(AFTER_COMMIT, []))
            return result

    def _read_sync(self, fn: Callable[..., T], *args: Any) -> T:
        with self.engine.connect() as connection:
            connection.execution_options(flowsvc_write=False)
            with connection.begin():
                return fn(connection, *args)

    async def _in_thread(self, fn: Callable[..., T], *args: Any) -> T:
        try:
            return await trio.to_thread.run_sync(fn, *args, limiter=self.limiter)
        except (OperationalError, DBAPIError) as exc:
            if isinstance(exc, DBAPIError) and not exc.connection_invalidated \
                    and not isinstance(exc, OperationalError):
                raise
            log.warning("database unavailable: %s", type(exc.orig).__name__ if exc.orig else exc)
            raise Unavailable("the database is unavailable") from exc
