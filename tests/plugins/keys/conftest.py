"""Fixtures of the keys tests: each deployment pairing, and a running service on it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from runtime.server import Running
from tests.support.backends import REDIS_URL, postgres_schema
from tests.support.keys import KEY_BACKENDS, keys_env
from tests.support.server import make_settings, running_server


@pytest.fixture(params=KEY_BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``(database url, redis url)``: SQLite with in-process meters, PostgreSQL with Redis."""
    if request.param == "sqlite-memory":
        yield f"sqlite:///{tmp_path / 'flowsvc.db'}", ""
        return
    with postgres_schema() as url:
        yield url, REDIS_URL


PRICING = {"GET /me": "0.4", "GET /me/api-keys/<int:key_id>/usage": "0.25"}


@pytest.fixture
def env(tmp_path: Path, backend: tuple[str, str]) -> dict[str, str]:
    """A keys service's settings on the backend pairing, with a few priced routes."""
    return keys_env(tmp_path / "var", *backend, pricing=PRICING)


@pytest.fixture
async def server(env: dict[str, str]) -> AsyncIterator[Running]:
    async with running_server(make_settings(env), env) as running:
        yield running
