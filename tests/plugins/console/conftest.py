"""Fixtures of the console tests: a service with auth, keys and console on each backend."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runtime.server import Running
from tests.support.backends import REDIS_URL, postgres_schema
from tests.support.keys import KEY_BACKENDS, keys_env
from tests.support.server import make_settings, running_server

PLUGINS = '["auth", "keys", "console"]'


@pytest.fixture(params=KEY_BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(database url, redis url)``: SQLite in process, PostgreSQL with Redis."""
    if request.param == "sqlite-memory":
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}", ""
        return
    with postgres_schema() as url:
        yield url, REDIS_URL


@pytest.fixture
async def server(tmp_path: Path, backend: tuple[str, str]) -> AsyncIterator[Running]:
    env = keys_env(tmp_path / "var", *backend,
                   extra={"FLOWSVC_PLUGINS_ENABLED": PLUGINS,
                          # The live tail's test measures a second: rows reach the log fast.
                          "FLOWSVC_PLUGINS_KEYS_USAGE_FLUSH_SECONDS": "0.1"})
    async with running_server(make_settings(env), env) as running:
        yield running
