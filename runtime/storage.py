"""Storage: SQLAlchemy 2 Core over SQLite (embedded default) or PostgreSQL (psycopg 3).

Blocking database calls never run on the Trio thread: ``Database.write`` and
``Database.read`` run a plain function in a worker thread, limited by a small
``trio.CapacityLimiter`` (``service.db_threads``, 4 by default; more threads only fight
over the GIL, see ``docs/performance.md``). A write function gets a connection inside
one transaction; everything it does commits together or not at all, which is what the
webhook outbox relies on.

Every call has one deadline, ``database.timeout_seconds`` (5 s by default), from asking for
a thread to the result; past it the caller gets ``Unavailable`` (503). A thread blocked in a
socket cannot be cancelled, and a frozen PostgreSQL never answers, so the deadline is kept
on the Trio side: the caller stops waiting and abandons the thread. The thread keeps its
limiter slot until it really ends (so a hung server never gets more than ``db_threads``
threads, and once every slot is held so, calls fail at once instead of waiting for one), a
write it was doing rolls back instead of committing if it had not reached its commit yet,
and the server side bounds it too: ``statement_timeout`` (the same deadline),
``connect_timeout`` and TCP keepalives for a server that vanished. SQLite waits for a lock
(its busy timeout) for the same deadline.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import trio
from sqlalchemy import Connection, Engine, create_engine, event, make_url, text
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


# A server that vanished (no RST, no FIN) is noticed by TCP keepalives after about
# 10 + 3 * 5 s of silence, and by an unacknowledged write after 30 s; a frozen server's
# kernel still acknowledges, so only the Trio-side deadline helps there.
_KEEPALIVE_OPTIONS = {"keepalives": 1, "keepalives_idle": 10, "keepalives_interval": 5,
                      "keepalives_count": 3, "tcp_user_timeout": 30_000}


def make_engine(url: str, pool_size: int, *, timeout: float = 5.0,
                connect_timeout: float = 3.0) -> Engine:
    """An engine with the settings each backend needs to be safe under concurrency.

    :param timeout: PostgreSQL's ``statement_timeout``, SQLite's busy timeout, and the
        wait for a pooled connection (seconds).
    :param connect_timeout: PostgreSQL's ``connect_timeout`` (whole seconds, at least 2).
    """
    url = normalize_url(url)
    if url.startswith("sqlite"):
        path = url.split("///", 1)[1] if "///" in url else ""
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": timeout},
                               pool_size=pool_size, max_overflow=0, pool_timeout=timeout)
        event.listen(engine, "connect", partial(_sqlite_on_connect, timeout))
        event.listen(engine, "begin", _sqlite_on_begin)
        return engine
    # Added to the URL's own ``options`` (a search_path, say), which connect_args replace.
    options = make_url(url).query.get("options", "")
    options = " ".join([*([options] if isinstance(options, str) else options),
                        f"-c statement_timeout={int(timeout * 1000)}"]).strip()
    connect_args = {**_KEEPALIVE_OPTIONS, "connect_timeout": max(2, round(connect_timeout)),
                    "options": options}
    return create_engine(url, pool_size=pool_size, max_overflow=2, pool_pre_ping=True,
                         pool_timeout=timeout, connect_args=connect_args)


def _sqlite_on_connect(timeout: float, dbapi_connection: Any, _record: Any) -> None:
    # Take transaction control away from pysqlite so that we can BEGIN IMMEDIATE:
    # a deferred transaction that later writes can fail with "database is locked"
    # without waiting, which busy_timeout does not cover.
    dbapi_connection.isolation_level = None
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
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


class _Abandoned(Exception):
    """Raised in a write's thread when its caller gave up: the transaction rolls back."""


class _Call:
    """One database call: whether its caller gave up on it, whether its thread runs it."""

    __slots__ = ("abandoned", "running")

    def __init__(self) -> None:
        self.abandoned = False
        self.running = False


class Database:
    """One engine and the thread limiter its calls go through.

    :param url: a SQLAlchemy URL; ``postgresql://`` is routed to psycopg 3.
    :param threads: how many database calls may run at once.
    :param timeout: the deadline of one call, in seconds (see the module docstring).
    :param connect_timeout: the deadline of opening a PostgreSQL connection.
    """

    def __init__(self, url: str, threads: int, *, timeout: float = 5.0,
                 connect_timeout: float = 3.0) -> None:
        self.url = normalize_url(url)
        self.timeout = timeout
        self.engine = make_engine(self.url, pool_size=threads, timeout=timeout,
                                  connect_timeout=connect_timeout)
        self.limiter = trio.CapacityLimiter(threads)
        self.stuck = 0  # abandoned calls whose thread has not ended: they hold their slots
        self._calls_lock = threading.Lock()

    @property
    def dialect(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    async def write(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in one transaction in a worker thread.

        :raises Unavailable: the database cannot be reached or did not answer in time (the
            transaction then rolls back, unless it was already committing).
        """
        callbacks: list[Callable[[], None]] = []
        call = _Call()
        result = await self._in_thread(call, partial(self._write_sync, fn, callbacks, call),
                                       *args)
        for callback in callbacks:
            callback()
        return result

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """Run ``fn(connection, *args)`` in a read-only transaction in a worker thread.

        :raises Unavailable: the database cannot be reached or did not answer in time.
        """
        return await self._in_thread(_Call(), self._read_sync, fn, *args)

    async def ping(self, *, timeout: float | None = None) -> None:
        """Check the database answers.

        :param timeout: a deadline shorter than the usual one (a readiness probe's).
        :raises Unavailable: it does not, or not within the deadline.
        """
        await self._in_thread(_Call(), self._read_sync, _select_one, timeout=timeout)

    def dispose(self) -> None:
        self.engine.dispose()

    def _write_sync(self, fn: Callable[..., T], callbacks: list[Callable[[], None]],
                    call: _Call, *args: Any) -> T:
        with self.engine.connect() as connection:
            connection.info.pop(AFTER_COMMIT, None)
            with connection.begin():
                result = fn(connection, *args)
                if call.abandoned:
                    raise _Abandoned  # the caller answered 503: do not commit behind it
            callbacks.extend(connection.info.pop(AFTER_COMMIT, []))
            return result

    def _read_sync(self, fn: Callable[..., T], *args: Any) -> T:
        with self.engine.connect() as connection:
            connection.execution_options(flowsvc_write=False)
            with connection.begin():
                return fn(connection, *args)

    async def _in_thread(self, call: _Call, fn: Callable[..., T], *args: Any,
                         timeout: float | None = None) -> T:
        if self.stuck >= self.limiter.total_tokens:
            # Every thread waits for a database that does not answer: say so at once
            # rather than after a deadline spent waiting for a slot.
            raise Unavailable("the database is not answering")
        # Only the deadline abandons the thread: the shield keeps an outer cancellation (a
        # client gone, a shutdown) waiting for the call as before, for at most the deadline.
        timeout = self.timeout if timeout is None else min(timeout, self.timeout)
        with trio.CancelScope(shield=True), trio.move_on_after(timeout) as deadline:
            try:
                return await trio.to_thread.run_sync(self._run, call, fn, *args,
                                                     limiter=self.limiter,
                                                     abandon_on_cancel=True)
            except (OperationalError, DBAPIError) as exc:
                if isinstance(exc, DBAPIError) and not exc.connection_invalidated \
                        and not isinstance(exc, OperationalError):
                    raise
                log.warning("database unavailable: %s",
                            type(exc.orig).__name__ if exc.orig else exc)
                raise Unavailable("the database is unavailable") from exc
        assert deadline.cancelled_caught
        with self._calls_lock:
            call.abandoned = True
            if call.running:  # else it never started (no slot) or has ended
                self.stuck += 1
        log.warning("database call abandoned after %g s", timeout)
        raise Unavailable(f"the database did not answer within {timeout:g} s")

    def _run(self, call: _Call, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread, noting while it runs."""
        with self._calls_lock:
            if call.abandoned:
                raise _Abandoned  # the caller gave up before this thread started
            call.running = True
        try:
            return fn(*args)
        finally:
            with self._calls_lock:
                call.running = False
                if call.abandoned:
                    self.stuck -= 1


def _select_one(connection: Connection) -> Any:
    return connection.execute(text("SELECT 1")).scalar()
