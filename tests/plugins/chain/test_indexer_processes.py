"""Two services on PostgreSQL indexing two chains: one indexer per chain at a time; the
holder, a ``flowsvc serve`` process, killed (SIGKILL) mid-way, is replaced by the other
service (in the test's process) within its lease; every ``payout.sent`` reaches the user's
webhook exactly once, and the counters are exact."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
from sqlalchemy import select

from plugins.chain.indexed import token_counters
from plugins.chain.state import CHAIN
from plugins.chain.tables import cursors
from tests.support.backends import POSTGRES_URL, REDIS_URL, postgres_schema
from tests.support.chain.actions import buy, join, mine, sell
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, launch_dpnm
from tests.support.chain.indexing import deployed_anvil, expected_of, head_number
from tests.support.chain.service import chain_entry, chains_env
from tests.support.projects import eventually
from tests.support.server import free_port, make_settings, running_server
from tests.support.wallet import sign_in
from tests.support.webhook_receiver import running_receiver
from tests.support.webhooks import migrate_schema, service_process, subscribe, webhook_env

UNIT = 10**18
OTHER_CHAIN_ID = 4343


@pytest.fixture(scope="module")
def other() -> Iterator[tuple[Anvil, Deployment]]:
    """A second chain, with another id."""
    with deployed_anvil(OTHER_CHAIN_ID) as pair:
        yield pair


async def _states(base: str) -> dict[str, str]:
    async with httpx.AsyncClient(timeout=10) as http:
        ready = (await http.get(f"{base}/readyz")).json()["checks"]["chain_indexers"]
    return {name: chain["state"] for name, chain in ready["chains"].items()}


@pytest.mark.postgres
async def test_two_processes_one_indexer_per_chain_each_event_once(
        tmp_path: Path, anvil: Anvil, deployment: Deployment,
        other: tuple[Anvil, Deployment], chain: Chain) -> None:
    other_anvil, other_deployment = other
    assert POSTGRES_URL, ("this test needs FLOWSVC_TEST_POSTGRES_URL (deselect it with "
                          "-m 'not postgres')")
    dpnm = await launch_dpnm(chain, deployment.platform)
    seller = await join(dpnm, dpnm.root.address, usdt=500 * UNIT)
    await buy(dpnm, seller, 50 * UNIT)
    with postgres_schema() as database_url:
        env = {**webhook_env(tmp_path / "var", database_url,
                             plugins=["auth", "chain", "webhooks"]),
               "FLOWSVC_REDIS_URL": REDIS_URL, "FLOWSVC_SERVICE_LOG_LEVEL": "warning",
               "FLOWSVC_PLUGINS_CHAIN_LEASE_SECONDS": "2",
               **chains_env([chain_entry(deployment.platform, [anvil.url],
                                         instance=dpnm.instance.address),
                             chain_entry(other_deployment.platform, [other_anvil.url],
                                         instance=other_deployment.dpnm.instance)])}
        await migrate_schema(env)
        port = free_port()
        first_base = f"http://127.0.0.1:{port}"
        async with running_receiver() as receiver, service_process(env, port) as first:

            async def first_holds_both() -> bool:
                return set((await _states(first_base)).values()) == {"indexing"}

            await eventually(first_holds_both, timeout=20)
            async with running_server(make_settings(env), env) as second:
                second_base = second.base_url
                assert set((await _states(second_base)).values()) == {"standby"}
                async with httpx.AsyncClient(base_url=second_base, timeout=30) as http:
                    await sign_in(http, seller)
                    await subscribe(http, receiver.url(), ["payout.sent"])
                await sell(dpnm, seller, 5 * UNIT)
                await mine(chain.rpc, 2)
                await receiver.wait_for(1, timeout=20)

                # The process indexing both chains dies without a word; the other takes over.
                os.kill(first.pid, signal.SIGKILL)
                await sell(dpnm, seller, 5 * UNIT)
                await sell(dpnm, seller, 5 * UNIT)
                last = await head_number(chain.rpc)
                await mine(chain.rpc, 2)
                received = await receiver.wait_for(3, timeout=30)
                await trio.sleep(1)  # a duplicate would arrive now
                assert set((await _states(second_base)).values()) == {"indexing"}
                assert len(receiver.received) == 3
                owners = await second.service.db.read(lambda connection: connection.execute(
                    select(cursors.c.lease_owner)).scalars().all())
                assert owners == [second.service.state(CHAIN).owner] * 2
                counters = await second.service.db.read(token_counters, chain.chain_id,
                                                        dpnm.instance.address)
    expected = await expected_of(dpnm, last)
    assert (counters.total_tree_positions, counters.lifetime_fees_usdt) == \
        (expected.tree_positions, expected.fees_usdt)
    ids = [json.loads(request.body)["data"]["payout_id"] for request in received]
    assert len(ids) == len(set(ids)) == 3
