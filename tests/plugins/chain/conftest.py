"""Fixtures of the chain tests: one anvil per test module with the reference stack deployed,
per test a connection to it and a dpnm instance of its own, and the httpx client a test's
RPC pools send through."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import trio

from plugins.chain.endpoint import open_client
from tests.support.chain.anvil import DEFAULT_CHAIN_ID, Anvil, running_anvil
from tests.support.chain.contracts import Chain, open_chain
from tests.support.chain.deploy import Deployment, Dpnm, deploy_stack, launch_dpnm


@pytest.fixture(scope="module")
def anvil() -> Iterator[Anvil]:
    """An anvil shared by the module's tests (each test makes its own users and instances)."""
    with running_anvil(DEFAULT_CHAIN_ID) as node:
        yield node


async def _deploy(url: str) -> Deployment:
    async with open_chain(url) as chain:
        return await deploy_stack(chain)


@pytest.fixture(scope="module")
def deployment(anvil: Anvil) -> Deployment:
    """The reference stack, deployed once per module in a Trio run of its own (pytest-trio's
    async fixtures are per test)."""
    return trio.run(_deploy, anvil.url)


@pytest.fixture
async def chain(anvil: Anvil) -> AsyncIterator[Chain]:
    async with open_chain(anvil.url) as connected:
        yield connected


@pytest.fixture
async def dpnm(chain: Chain, deployment: Deployment) -> Dpnm:
    """A fresh dpnm instance: its own pool, tree and root."""
    return await launch_dpnm(chain, deployment.platform)


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    """The httpx client a test's RPC pools send through: the service's own kind."""
    async with open_client() as client:
        yield client
