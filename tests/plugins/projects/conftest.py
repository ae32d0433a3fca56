"""Fixtures of the projects plugin's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from runtime.server import Running
from tests.support.projects import serve_projects


@pytest.fixture
async def running_tokens(tmp_path: Path) -> AsyncIterator[Running]:
    """A service with the projects plugin on SQLite, for tests that need no project."""
    async with serve_projects(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}") \
            as running:
        yield running
