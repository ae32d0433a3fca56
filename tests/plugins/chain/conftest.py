"""Fixtures of the chain plugin's tests."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The httpx client a test's RPC pools send through."""
    async with httpx.AsyncClient() as client:
        yield client
