"""Storage on SQLite and PostgreSQL: transactions, after-commit callbacks, worker threads."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import trio
from sqlalchemy import (
    Column,
    Connection,
    Integer,
    MetaData,
    String,
    Table,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from runtime.errors import Unavailable
from runtime.storage import Database, after_commit, normalize_url
from tests.support.server import free_port

metadata = MetaData()
notes = Table("notes", metadata, Column("id", Integer, primary_key=True),
              Column("text", String(100), nullable=False, unique=True))
counters = Table("counters", metadata, Column("name", String(20), primary_key=True),
                 Column("value", Integer, nullable=False))


@pytest.fixture
def db(database_url: str) -> Iterator[Database]:
    database = Database(database_url, threads=3)
    metadata.create_all(database.engine)
    try:
        yield database
    finally:
        database.dispose()


def _add(connection: Connection, *texts: str) -> None:
    for text in texts:
        connection.execute(insert(notes).values(text=text))


def _texts(connection: Connection) -> list[str]:
    return sorted(connection.execute(select(notes.c.text)).scalars())


async def test_write_commits_everything_together(db: Database) -> None:
    await db.write(_add, "one", "two")
    assert await db.read(_texts) == ["one", "two"]


async def test_write_rolls_back_everything_on_an_exception(db: Database) -> None:
    def half_then_fail(connection: Connection) -> None:
        _add(connection, "kept?")
        raise LookupError("changed my mind")

    with pytest.raises(LookupError, match="changed my mind"):
        await db.write(half_then_fail)
    with pytest.raises(IntegrityError):  # a constraint error is the caller's, not a 503
        await db.write(_add, "same", "same")
    assert await db.read(_texts) == []


async def test_after_commit_callbacks_run_on_the_trio_thread_after_the_commit(
        db: Database) -> None:
    seen: list[tuple[int, list[str]]] = []

    def check() -> None:
        # Another connection sees the row: the transaction has committed.
        with db.engine.connect() as other:
            seen.append((threading.get_ident(), _texts(other)))

    def add_and_wake(connection: Connection, text: str) -> None:
        _add(connection, text)
        after_commit(connection, check)

    await db.write(add_and_wake, "visible")
    assert seen == [(threading.get_ident(), ["visible"])]


async def test_after_commit_callbacks_of_a_rolled_back_write_never_run(db: Database) -> None:
    woken: list[str] = []

    def add_wake_fail(connection: Connection) -> None:
        _add(connection, "lost")
        after_commit(connection, lambda: woken.append("rolled back"))
        raise RuntimeError("abort")

    with pytest.raises(RuntimeError):
        await db.write(add_wake_fail)
    for _ in range(4):  # every pooled connection: no callback is left behind on any
        await db.write(_add, f"n{_}")
    assert woken == []


async def test_calls_run_in_worker_threads(db: Database) -> None:
    trio_thread = threading.get_ident()
    write_thread = await db.write(lambda connection: threading.get_ident())
    read_thread = await db.read(lambda connection: threading.get_ident())
    assert trio_thread not in (write_thread, read_thread)


async def test_the_limiter_caps_concurrent_calls_at_db_threads(db: Database) -> None:
    lock = threading.Lock()
    running = peak = 0

    def slow(connection: Connection) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.1)
        with lock:
            running -= 1

    # Reads: SQLite runs them side by side, while its writers queue for the one write lock.
    async with trio.open_nursery() as nursery:
        for _ in range(12):
            nursery.start_soon(db.read, slow)
    assert peak == 3
    assert db.limiter.total_tokens == 3


async def test_concurrent_writers_do_not_lose_updates(db: Database) -> None:
    await db.write(lambda c: c.execute(insert(counters).values(name="hits", value=0)))

    def increment(connection: Connection) -> None:
        current = connection.execute(
            select(counters.c.value).where(counters.c.name == "hits")).scalar_one()
        connection.execute(update(counters).where(counters.c.name == "hits")
                           .values(value=current + 1))

    async with trio.open_nursery() as nursery:
        for _ in range(20):
            nursery.start_soon(db.write, _increment_atomically)
    total = await db.read(lambda c: c.execute(select(func.sum(counters.c.value))).scalar())
    assert total == 20
    # On SQLite a read-modify-write is safe too: writes take the lock at BEGIN.
    if db.dialect == "sqlite":
        async with trio.open_nursery() as nursery:
            for _ in range(20):
                nursery.start_soon(db.write, increment)
        assert await db.read(lambda c: c.execute(select(counters.c.value)).scalar()) == 40


def _increment_atomically(connection: Connection) -> None:
    connection.execute(update(counters).where(counters.c.name == "hits")
                       .values(value=counters.c.value + 1))


async def test_an_unreachable_database_is_unavailable() -> None:
    database = Database(f"postgresql://postgres@127.0.0.1:{free_port()}/flowsvc", threads=2)
    try:
        with pytest.raises(Unavailable, match="the database is unavailable"):
            await database.ping()
        with pytest.raises(Unavailable):
            await database.write(_add, "nowhere")
        with pytest.raises(Unavailable):
            await database.read(_texts)
    finally:
        database.dispose()


def test_postgresql_urls_use_psycopg_3() -> None:
    assert normalize_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalize_url("sqlite:///var/x.db") == "sqlite:///var/x.db"


def test_dialect_names_the_backend(db: Database) -> None:
    assert db.dialect in {"sqlite", "postgresql"}
    assert db.dialect == ("sqlite" if db.url.startswith("sqlite") else "postgresql")


@pytest.fixture
def quick_db(database_url: str) -> Iterator[Database]:
    """Two threads and a one-second deadline."""
    database = Database(database_url, threads=2, timeout=1.0)
    metadata.create_all(database.engine)
    try:
        yield database
    finally:
        database.dispose()


async def test_a_call_past_its_deadline_is_abandoned_and_its_write_rolls_back(
        quick_db: Database) -> None:
    release = threading.Event()

    def slow_add(connection: Connection) -> None:
        _add(connection, "late")
        release.wait(30)  # the statement has run; the commit would come after this

    began = time.monotonic()
    with pytest.raises(Unavailable, match="did not answer within 1 s"):
        await quick_db.write(slow_add)
    assert time.monotonic() - began < 1 + 4  # the deadline, with a margin for a loaded machine
    release.set()
    with trio.fail_after(10):
        while quick_db.stuck:  # noqa: ASYNC110 - a thread's end has no event to wait on
            await trio.sleep(0.01)
    assert await quick_db.read(_texts) == []


async def test_once_abandoned_calls_hold_every_thread_calls_fail_at_once(
        quick_db: Database) -> None:
    release = threading.Event()
    async with trio.open_nursery() as nursery:
        for _ in range(2):
            nursery.start_soon(_expect_unavailable, quick_db, release)
    assert quick_db.stuck == 2
    began = time.monotonic()
    with pytest.raises(Unavailable, match="not answering"):
        await quick_db.read(_texts)
    assert time.monotonic() - began < 0.5
    release.set()
    with trio.fail_after(10):
        while quick_db.stuck:  # noqa: ASYNC110 - a thread's end has no event to wait on
            await trio.sleep(0.01)
    assert await quick_db.read(_texts) == []


async def _expect_unavailable(database: Database, release: threading.Event) -> None:
    with pytest.raises(Unavailable, match="did not answer"):
        await database.read(lambda connection: release.wait(30))


async def test_the_deadline_reaches_the_server_and_keeps_the_urls_options(
        database_url: str) -> None:
    database = Database(database_url, threads=1, timeout=2.5)
    try:
        if database.dialect == "postgresql":
            timeout = await database.read(
                lambda c: c.exec_driver_sql("SHOW statement_timeout").scalar())
            assert timeout == "2500ms"
            path = await database.read(lambda c: c.exec_driver_sql("SHOW search_path").scalar())
            assert "options=" not in database_url or path in database_url  # the test schema
        else:
            busy = await database.read(lambda c: c.exec_driver_sql("PRAGMA busy_timeout").scalar())
            assert busy == 2500
    finally:
        database.dispose()
