"""A database outage while the indexer follows a chain (a private PostgreSQL stopped and
started again): waited out, not a crash, and what happened meanwhile is indexed once."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from plugins.chain.indexed import token_counters
from plugins.chain.state import CHAIN
from tests.support.chain.actions import buy, join, mine
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, launch_dpnm
from tests.support.chain.indexing import head_number, indexing, until_final
from tests.support.chain.service import chain_entry
from tests.support.private_servers import private_postgres
from tests.support.projects import eventually

UNIT = 10**18


@pytest.mark.postgres
async def test_a_database_outage_is_waited_out(tmp_path: Path, anvil: Anvil,
                                               deployment: Deployment, chain: Chain) -> None:
    dpnm = await launch_dpnm(chain, deployment.platform)
    user = await join(dpnm, dpnm.root.address, usdt=500 * UNIT)
    entries = [chain_entry(deployment.platform, [anvil.url], instance=dpnm.instance.address)]
    with private_postgres() as postgres:
        async with indexing(tmp_path / "var", postgres.url, entries) as (running, _):
            service = running.service
            status = service.state(CHAIN).indexers[chain.chain_id]
            await until_final(service, chain.chain_id, await head_number(chain.rpc) - 2)
            await trio.to_thread.run_sync(postgres.stop)
            await buy(dpnm, user, 30 * UNIT)
            last = await head_number(chain.rpc)
            await mine(chain.rpc, 2)

            async def waiting() -> bool:
                return status.waiting is not None

            await eventually(waiting, timeout=20)
            assert status.state == "indexing"
            await trio.to_thread.run_sync(postgres.start)
            await until_final(service, chain.chain_id, last, timeout=40)
            counters = await service.db.read(token_counters, chain.chain_id,
                                             dpnm.instance.address)
            assert counters.lifetime_fees_usdt == 6 * UNIT
            assert not service.metrics.registry.get_sample_value(
                "flowsvc_actor_restarts_total", {"actor": f"chain.indexer.chain{chain.chain_id}"})
