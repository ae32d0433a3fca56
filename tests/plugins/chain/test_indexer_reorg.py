"""Reorgs on anvil (``evm_snapshot`` / ``evm_revert`` then new blocks): a dropped block with
events is rolled back by inverse deltas and the new branch followed, also when the indexer
first sees the reorg with the head already past the finality depth (it was stopped); a reorg
deeper than the finality depth stops the indexer loudly and leaves the data as it was."""

from __future__ import annotations

from pathlib import Path

import trio
from sqlalchemy import func, select

from plugins.chain.indexed import TokenCounters, earned_by_level, token_counters
from plugins.chain.tables import logs
from runtime.service import Service
from tests.support.chain.actions import buy, extend_tree, join, latest_block, mine, reorg, snapshot
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, launch_dpnm
from tests.support.chain.indexing import (
    expected_of,
    head_number,
    indexer_state,
    indexing,
    until_final,
    until_indexed,
)
from tests.support.chain.rpc_proxy import running_proxy
from tests.support.chain.service import chain_entry
from tests.support.projects import eventually
from tests.support.server import client

UNIT = 10**18


async def test_a_reorg_rolls_back_and_follows_the_new_branch(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    dpnm = await launch_dpnm(chain, deployment.platform)
    sponsor = await join(dpnm, dpnm.root.address, usdt=500 * UNIT, months=1)
    buyer = await join(dpnm, sponsor.address, usdt=500 * UNIT, months=1)
    entries = [chain_entry(deployment.platform, [anvil.url], finality_depth=5,
                           instance=dpnm.instance.address)]
    async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                        entries) as (running, _):
        service = running.service
        instance = dpnm.instance.address

        async def counters_now() -> tuple[int, int, list[int]]:
            counters = await service.db.read(token_counters, chain.chain_id, instance)
            earned = await service.db.read(earned_by_level, chain.chain_id, instance,
                                           sponsor.address)
            return counters.lifetime_fees_usdt, counters.total_active_positions, earned

        fork = await snapshot(chain.rpc)
        await until_indexed(service, chain.chain_id, fork.number,
                            (await latest_block(chain.rpc))["hash"])
        before = await counters_now()
        await buy(dpnm, buyer, 40 * UNIT)  # a block with Bought and RewardPaid
        new_user = await join(dpnm, buyer.address, usdt=100 * UNIT, months=1)
        top = await latest_block(chain.rpc)
        await until_indexed(service, chain.chain_id, int(top["number"], 16), top["hash"])
        during = await counters_now()
        assert during[0] == before[0] + 8 * UNIT and during[1] == before[1] + 1
        assert sum(during[2]) > sum(before[2])

        replaced = await reorg(chain.rpc, fork)  # same height, new empty blocks
        assert replaced.old != replaced.new
        await mine(chain.rpc)  # one block more: the indexer meets the new branch
        top = await latest_block(chain.rpc)
        await until_indexed(service, chain.chain_id, int(top["number"], 16), top["hash"])
        assert await counters_now() == before
        dropped = await service.db.read(lambda connection: connection.execute(
            select(func.count()).select_from(logs)
            .where(logs.c.block_hash.in_(replaced.old))).scalar_one())
        assert dropped == 0

        # The new branch is followed: what happens on it counts, once.
        await buy(dpnm, buyer, 25 * UNIT)
        await extend_tree(dpnm, buyer, 1)
        last = await head_number(chain.rpc)
        await mine(chain.rpc, 5)
        await until_final(service, chain.chain_id, last)
        expected = await expected_of(dpnm, last)
        counters = await service.db.read(token_counters, chain.chain_id, instance)
        assert counters.lifetime_fees_usdt == expected.fees_usdt == before[0] + 5 * UNIT
        assert counters.total_tree_positions == expected.tree_positions
        assert await service.db.read(earned_by_level, chain.chain_id, instance,
                                     sponsor.address) == expected.earned[sponsor.address.lower()]
        assert not await dpnm.protocol.call("isActivated", new_user.address)
        async with client(running) as http:
            metrics = (await http.get("/metrics")).text
        assert f'flowsvc_chain_reorgs_total{{chain="chain{chain.chain_id}"}} 1.0' in metrics


async def test_a_reorg_deeper_than_finality_stops_the_indexer(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    dpnm = await launch_dpnm(chain, deployment.platform)
    user = await join(dpnm, dpnm.root.address, usdt=500 * UNIT)
    entries = [chain_entry(deployment.platform, [anvil.url], finality_depth=2,
                           instance=dpnm.instance.address)]
    async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                        entries) as (running, _), client(running) as http:
        service = running.service
        fork = await snapshot(chain.rpc)
        await buy(dpnm, user, 30 * UNIT)
        await mine(chain.rpc, 4)  # the buy is final now
        await until_final(service, chain.chain_id, fork.number + 1)
        kept = await service.db.read(token_counters, chain.chain_id, dpnm.instance.address)
        await reorg(chain.rpc, fork)
        await mine(chain.rpc)

        async def stopped() -> bool:
            return indexer_state(service, chain.chain_id) == "stopped"

        await eventually(stopped, timeout=15)
        ready = await http.get("/readyz")
        assert ready.status_code == 503
        check = ready.json()["checks"]["chain_indexers"]
        assert check["ok"] is False and "deeper than finality_depth 2" in check["error"]
        assert await service.db.read(token_counters, chain.chain_id,
                                     dpnm.instance.address) == kept


async def _figures(service: Service, chain_id: int, instance: str,
                   users: list[str]) -> tuple[TokenCounters, list[list[int]]]:
    counters = await service.db.read(token_counters, chain_id, instance)
    earned = [await service.db.read(earned_by_level, chain_id, instance, user) for user in users]
    return counters, earned


async def test_a_reorg_first_seen_past_finality_is_rolled_back(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain,
        database_url: str) -> None:
    """The indexer counts tip blocks, stops; the node drops them and moves more than
    finality_depth blocks past them with other events; the indexer restarted rolls the
    dropped blocks back: its figures equal a fresh index of the canonical chain."""
    dpnm = await launch_dpnm(chain, deployment.platform)
    instance = dpnm.instance.address
    sponsor = await join(dpnm, dpnm.root.address, usdt=500 * UNIT, months=1)
    buyer = await join(dpnm, sponsor.address, usdt=500 * UNIT, months=1)
    users = [dpnm.root.address, sponsor.address, buyer.address]
    depth = 8
    entries = [chain_entry(deployment.platform, [anvil.url], finality_depth=depth,
                           instance=instance)]
    fork = await snapshot(chain.rpc)
    async with indexing(tmp_path / "var", database_url, entries) as (running, _):
        service = running.service
        await until_indexed(service, chain.chain_id, fork.number,
                            (await latest_block(chain.rpc))["hash"])
        before, _ = await _figures(service, chain.chain_id, instance, users)
        await buy(dpnm, buyer, 40 * UNIT)  # Bought and RewardPaid, in a tip block
        await join(dpnm, buyer.address, usdt=100 * UNIT, months=1)
        top = await latest_block(chain.rpc)
        assert int(top["number"], 16) - fork.number < depth  # every block above stays unfinal
        await until_indexed(service, chain.chain_id, int(top["number"], 16), top["hash"])
        counted, _ = await _figures(service, chain.chain_id, instance, users)
        assert counted.lifetime_fees_usdt == before.lifetime_fees_usdt + 8 * UNIT

    replaced = await reorg(chain.rpc, fork)
    await buy(dpnm, buyer, 25 * UNIT)  # other events on the new branch
    await extend_tree(dpnm, buyer, 1)
    await mine(chain.rpc, depth + 12)  # the dropped blocks are far below the head now
    head = await latest_block(chain.rpc)
    last = int(head["number"], 16)
    assert last - depth > fork.number + len(replaced.old)

    async with indexing(tmp_path / "var", database_url, entries) as (running, _), \
            client(running) as http:
        service = running.service
        await until_indexed(service, chain.chain_id, last, head["hash"])
        restarted = await _figures(service, chain.chain_id, instance, users)
        dropped = await service.db.read(lambda connection: connection.execute(
            select(func.count()).select_from(logs)
            .where(logs.c.block_hash.in_(replaced.old))).scalar_one())
        metrics = (await http.get("/metrics")).text
        assert f'flowsvc_chain_reorgs_total{{chain="chain{chain.chain_id}"}} 1.0' in metrics
    assert dropped == 0

    async with indexing(tmp_path / "fresh", f"sqlite:///{tmp_path / 'fresh.sqlite'}",
                        entries) as (running, _):
        await until_indexed(running.service, chain.chain_id, last, head["hash"])
        fresh = await _figures(running.service, chain.chain_id, instance, users)
    assert restarted == fresh
    expected = await expected_of(dpnm, last)
    counters, earned = restarted
    assert counters.lifetime_fees_usdt == expected.fees_usdt == before.lifetime_fees_usdt + 5 * UNIT
    assert counters.total_tree_positions == expected.tree_positions
    assert earned == [expected.earned.get(user.lower(), [0] * 10) for user in users]


async def test_a_reorg_happening_while_the_node_is_unreachable_is_rolled_back(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    """The running indexer loses its node (502s) after counting tip blocks; meanwhile the
    node drops them and moves more than finality_depth blocks on. When the node answers
    again the indexer (never restarted) rolls them back."""
    dpnm = await launch_dpnm(chain, deployment.platform)
    instance = dpnm.instance.address
    user = await join(dpnm, dpnm.root.address, usdt=500 * UNIT, months=1)
    depth = 4
    async with running_proxy(anvil.url) as proxy:
        entries = [chain_entry(deployment.platform, [proxy.url], finality_depth=depth,
                               instance=instance)]
        async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                            entries) as (running, _), client(running) as http:
            service = running.service
            fork = await snapshot(chain.rpc)
            await buy(dpnm, user, 40 * UNIT)
            top = await latest_block(chain.rpc)
            await until_indexed(service, chain.chain_id, int(top["number"], 16), top["hash"])
            assert (await service.db.read(token_counters, chain.chain_id,
                                          instance)).lifetime_fees_usdt == 8 * UNIT

            proxy.http_status = 502
            await reorg(chain.rpc, fork)
            await buy(dpnm, user, 25 * UNIT)
            await mine(chain.rpc, depth + 30)
            head = await latest_block(chain.rpc)
            last = int(head["number"], 16)
            await trio.sleep(1)  # the indexer meets the outage
            proxy.http_status = None
            await until_indexed(service, chain.chain_id, last, head["hash"], timeout=60)
            expected = await expected_of(dpnm, last)
            counters = await service.db.read(token_counters, chain.chain_id, instance)
            assert counters.lifetime_fees_usdt == expected.fees_usdt == 5 * UNIT
            assert await service.db.read(earned_by_level, chain.chain_id, instance,
                                         dpnm.root.address) == \
                expected.earned.get(dpnm.root.address.lower(), [0] * 10)
            metrics = (await http.get("/metrics")).text
            assert f'flowsvc_chain_reorgs_total{{chain="chain{chain.chain_id}"}} 1.0' in metrics
            assert indexer_state(service, chain.chain_id) == "indexing"
