"""Fixtures shared by every test: backends, settings and a real server on loopback."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile

# pytest's unraisable-exception hook imports tracemalloc on first use; a garbage collection
# during that import re-enters the hook with the module half made, and the warning it should
# have filtered (pyproject's filterwarnings) fails an unrelated test instead.
import tracemalloc  # noqa: F401
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import trio

from runtime.server import Running
from tests.support.backends import (
    DATABASES,
    REDIS_URL,
    SHARED_STATES,
    check_reachable,
    postgres_schema,
    redis_prefix,
)
from tests.support.scripted_dns import ScriptedResolver
from tests.support.server import make_settings, running_server, settings_env


def pytest_sessionstart(session: pytest.Session) -> None:
    problems = check_reachable()
    if problems:
        raise pytest.UsageError("test backends unreachable:\n  " + "\n  ".join(problems))


def pytest_configure(config: pytest.Config) -> None:
    # The temporary folders of this checkout's sessions live apart: the sandbox (tests run
    # as root) must pass through them, and a session resets its temporary root to 0700.
    checkout = hashlib.sha256(str(config.rootpath).encode()).hexdigest()[:12]
    root = Path(tempfile.gettempdir()) / f"flowsvc-tests-{checkout}"
    root.mkdir(mode=0o711, exist_ok=True)
    os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", str(root))


@pytest.fixture(autouse=True)
def _sandbox_reaches_tmp_path(tmp_path: Path) -> None:
    """Run as root, the sandbox mounts a work tree as its own uid, which must pass through
    the folders above it: pytest makes them private (0700)."""
    if os.geteuid() == 0:
        for folder in (tmp_path, tmp_path.parent, tmp_path.parent.parent):
            # Search only (no listing) for others: what bwrap as the sandbox uid needs.
            os.chmod(folder, stat.S_IMODE(folder.stat().st_mode) | 0o011)  # noqa: S103


@pytest.fixture(params=DATABASES)
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Each database backend: SQLite in a temporary folder, PostgreSQL in a fresh schema."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}"
        return
    with postgres_schema() as url:
        yield url


@pytest.fixture(params=SHARED_STATES)
def redis_url(request: pytest.FixtureRequest) -> str:
    """Each shared-state backend: in-process (empty URL) or Redis."""
    return REDIS_URL if request.param == "redis" else ""


@pytest.fixture
async def dns() -> AsyncIterator[ScriptedResolver]:
    """DNS answers the test sets (``dns.answers[name] = [addresses]``), through trio's own
    resolver hook, for as long as the test runs."""
    resolver = ScriptedResolver()
    previous = trio.socket.set_custom_hostname_resolver(resolver)
    yield resolver
    trio.socket.set_custom_hostname_resolver(previous)


@pytest.fixture
def env(tmp_path: Path, database_url: str) -> dict[str, str]:
    """The environment of a test service with the auth plugin, on each database."""
    return settings_env(tmp_path / "var", database_url=database_url,
                        redis_prefix=redis_prefix())


@pytest.fixture
async def server(env: dict[str, str]) -> AsyncIterator[Running]:
    """A running service configured by ``env``."""
    async with running_server(make_settings(env), env) as running:
        yield running
