"""The backends tests run on: SQLite always; PostgreSQL and Redis when their URLs are set.

``make test`` and ``.ci/run`` set ``FLOWSVC_TEST_POSTGRES_URL`` and ``FLOWSVC_TEST_REDIS_URL``
to the servers on 127.0.0.1; the root conftest then fails the run (never skips) when
either is unreachable. Each test gets its own PostgreSQL schema and its own Redis key
prefix, so several test runs can share one server.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

from bench import harness

POSTGRES_URL = os.environ.get("FLOWSVC_TEST_POSTGRES_URL", "")
REDIS_URL = os.environ.get("FLOWSVC_TEST_REDIS_URL", "")

DATABASES = ["sqlite"] + (["postgres"] if POSTGRES_URL else [])
SHARED_STATES = ["memory"] + (["redis"] if REDIS_URL else [])


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


@contextmanager
def postgres_schema() -> Iterator[str]:
    """A fresh schema in the test PostgreSQL; yields a SQLAlchemy URL that uses it."""
    with harness.postgres_schema(POSTGRES_URL) as url:
        yield url


@contextmanager
def another_database(tmp_path: Path, database_url: str) -> Iterator[str]:
    """A second, empty database on the backend of ``database_url``: a SQLite file beside it
    or a fresh PostgreSQL schema (for a service whose plugins must not meet the branches
    another service migrated: Alembic cannot upgrade a database holding a revision of a
    plugin that is not enabled)."""
    if database_url.startswith("sqlite"):
        yield f"sqlite:///{tmp_path / f'another-{secrets.token_hex(4)}.sqlite'}"
        return
    with postgres_schema() as url:
        yield url


@contextmanager
def preferred_database(tmp_path: Path) -> Iterator[str]:
    """A fresh PostgreSQL schema when the run has PostgreSQL (CI does), else SQLite in
    ``tmp_path``: for a test that runs once, on the backend that finds the most."""
    if POSTGRES_URL:
        with postgres_schema() as url:
            yield url
    else:
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}"


def redis_prefix() -> str:
    return f"flowsvc-test:{secrets.token_hex(6)}:"


def check_reachable() -> list[str]:
    """Problems reaching the configured test servers (empty when all answer)."""
    problems = []
    if POSTGRES_URL:
        try:
            with psycopg.connect(_plain(POSTGRES_URL), connect_timeout=3) as connection:
                connection.execute("SELECT 1")
        except psycopg.Error as exc:
            problems.append(f"PostgreSQL at {POSTGRES_URL} is unreachable: {exc}")
    if REDIS_URL:
        import redis

        try:
            redis.Redis.from_url(REDIS_URL, socket_connect_timeout=3).ping()
        except redis.RedisError as exc:
            problems.append(f"Redis at {REDIS_URL} is unreachable: {exc}")
    if os.environ.get("CI") == "true" and not (POSTGRES_URL and REDIS_URL):
        problems.append("CI=true needs FLOWSVC_TEST_POSTGRES_URL and FLOWSVC_TEST_REDIS_URL")
    return problems
