"""The indexer behind two misbehaving RPC proxies in front of one anvil: it adapts its
``eth_getLogs`` ranges to "range too large" answers, fails over on 429s, stalled requests and
a lagging head (never taking a lagging node for a reorg), and the counters stay exact."""

from __future__ import annotations

import re
from pathlib import Path

import trio
from eth_account.signers.local import LocalAccount

from plugins.chain.indexed import indexed_head, token_counters
from plugins.chain.state import CHAIN
from runtime.service import Service
from tests.support.chain.actions import buy, join, mine
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, Dpnm, launch_dpnm
from tests.support.chain.indexing import expected_of, head_number, indexing, until_final
from tests.support.chain.rpc_proxy import RpcProxy, running_proxy
from tests.support.chain.service import chain_entry
from tests.support.projects import eventually
from tests.support.server import client

UNIT = 10**18


def _requests(metrics: str, method: str, outcome: str, url: str | None = None) -> float:
    """The count of RPC requests of ``method`` that ended with ``outcome`` (to ``url``)."""
    total = 0.0
    for line in metrics.splitlines():
        if not line.startswith("flowsvc_chain_rpc_requests_total{"):
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', line))
        if labels["method"] == method and labels["outcome"] == outcome \
                and url in (None, labels["url"]):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _busiest(*proxies: RpcProxy) -> tuple[RpcProxy, RpcProxy]:
    """(the proxy the indexer polls now, the other one): the one whose head requests grow."""
    before = [proxy.methods["eth_blockNumber"] for proxy in proxies]
    await trio.sleep(0.5)
    grown = [proxy.methods["eth_blockNumber"] - seen for proxy, seen in zip(proxies, before,
                                                                             strict=True)]
    busy, idle = (proxies[0], proxies[1]) if grown[0] >= grown[1] else (proxies[1], proxies[0])
    return busy, idle


async def test_ranges_adapt_and_faults_fail_over(tmp_path: Path, anvil: Anvil,
                                                 deployment: Deployment, chain: Chain) -> None:
    start = await head_number(chain.rpc) + 1
    dpnm = await launch_dpnm(chain, deployment.platform)
    users = [await join(dpnm, dpnm.root.address, usdt=500 * UNIT) for _ in range(3)]
    for user in users:
        await buy(dpnm, user, 20 * UNIT)
    async with running_proxy(anvil.url) as first, running_proxy(anvil.url) as second:
        # Both refuse ranges over 3 blocks: one says which range works, one gives no hint.
        first.logs_range_limit = second.logs_range_limit = 3
        second.logs_error_style = "llamarpc"
        entries = [chain_entry(deployment.platform, [first.url, second.url], start_block=start,
                               instance=dpnm.instance.address)]
        async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                            entries) as (running, _), client(running) as http:
            service = running.service
            await _settled(chain, service, dpnm)
            metrics = (await http.get("/metrics")).text
            assert _requests(metrics, "eth_getLogs", "range") >= 1  # refused, then adapted
            first.logs_range_limit = second.logs_range_limit = None

            busy, idle = await _busiest(first, second)
            busy.http_status = 429  # rate limited: the other URL serves meanwhile
            served = idle.methods["eth_blockNumber"]
            await _more(dpnm, users[0])
            await _settled(chain, service, dpnm)
            assert idle.methods["eth_blockNumber"] > served
            busy.http_status = None
            metrics = (await http.get("/metrics")).text
            assert _requests(metrics, "eth_blockNumber", "rate_limited", busy.url) >= 1

            busy, idle = await _busiest(first, second)
            busy.head_lag = 50  # a node far behind the final block: lagging, not a reorg
            await _more(dpnm, users[1])
            await _settled(chain, service, dpnm)
            busy.head_lag = 0
            metrics = (await http.get("/metrics")).text
            assert _requests(metrics, "eth_blockNumber", "lagging", busy.url) >= 1

            busy, idle = await _busiest(first, second)
            busy.stall_seconds = 5  # past the 2 s timeout: a stalled provider
            served = idle.methods["eth_blockNumber"]
            await _more(dpnm, users[2])
            await _settled(chain, service, dpnm)
            busy.stall_seconds = 0
            assert idle.methods["eth_blockNumber"] > served
            metrics = (await http.get("/metrics")).text
            assert sum(_requests(metrics, method, "timeout", busy.url) for method in (
                "eth_blockNumber", "eth_getBlockByNumber", "eth_getLogs", "batch")) >= 1
            assert "flowsvc_chain_reorgs_total{" not in metrics  # no sample: no reorg


async def test_a_head_that_stops_advancing_fails_over(tmp_path: Path, anvil: Anvil,
                                                      deployment: Deployment) -> None:
    """The stall watchdog: no new head from a URL within ``stall_timeout_seconds`` cools it
    down (counted) and the other URL serves."""
    async with running_proxy(anvil.url) as first, running_proxy(anvil.url) as second:
        entries = [chain_entry(deployment.platform, [first.url, second.url],
                               stall_timeout_seconds=1, instance=deployment.dpnm.instance)]
        async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                            entries) as (running, _), client(running) as http:
            await trio.sleep(2.5)  # anvil mines nothing meanwhile: every head is stalled
            metrics = (await http.get("/metrics")).text
            stalls = [line for line in metrics.splitlines()
                      if line.startswith("flowsvc_chain_stalls_total{")]
            assert stalls and float(stalls[0].rsplit(" ", 1)[1]) >= 1
            assert first.methods["eth_blockNumber"] > 0 and second.methods["eth_blockNumber"] > 0


async def _more(dpnm: Dpnm, user: LocalAccount) -> None:
    await buy(dpnm, user, 20 * UNIT)


async def _settled(chain: Chain, service: Service, dpnm: Dpnm) -> None:
    """Mine past finality, wait for it, and check the counters against the logs."""
    last = await head_number(chain.rpc)
    await mine(chain.rpc, 2)
    await until_final(service, chain.chain_id, last, timeout=40)
    expected = await expected_of(dpnm, last)
    counters = await service.db.read(token_counters, chain.chain_id, dpnm.instance.address)
    assert (counters.total_tree_positions, counters.lifetime_fees_usdt) == \
        (expected.tree_positions, expected.fees_usdt)


async def test_a_restart_in_the_middle_of_history_loses_and_doubles_nothing(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    """History in ranges of 2 blocks (the proxy refuses more); the service stops after a few
    ranges committed (the proxy answers no logs past them) and a new one resumes from the
    cursor."""
    start = await head_number(chain.rpc) + 1
    dpnm = await launch_dpnm(chain, deployment.platform)
    users = [await join(dpnm, dpnm.root.address, usdt=500 * UNIT, months=1) for _ in range(4)]
    for user in users:
        await buy(dpnm, user, 20 * UNIT)
    last = await head_number(chain.rpc)
    await mine(chain.rpc, 2)
    database = f"sqlite:///{tmp_path / 'db.sqlite'}"
    async with running_proxy(anvil.url) as proxy:
        proxy.logs_range_limit = 2
        # The indexer cannot race past these ranges (as it did on a loaded machine, before
        # the outage below began): the first stop is mid-history whatever the timing.
        proxy.logs_down_past = start + 5
        entries = [chain_entry(deployment.platform, [proxy.url], start_block=start,
                               instance=dpnm.instance.address)]
        async with indexing(tmp_path / "var", database, entries) as (running, _):
            await until_final(running.service, chain.chain_id, start + 4)
            proxy.http_status = 502  # the only URL down: an outage, waited out, not a crash
            status = running.service.state(CHAIN).indexers[chain.chain_id]

            async def waiting() -> bool:
                return status.waiting is not None and "no RPC URL answered" in status.waiting

            await eventually(waiting)
            assert status.state == "indexing"
            assert not running.service.metrics.registry.get_sample_value(
                "flowsvc_actor_restarts_total", {"actor": f"chain.indexer.chain{chain.chain_id}"})
        assert await _final(running.service, chain.chain_id) < last  # stopped mid-history
        proxy.http_status = proxy.logs_down_past = None
        async with indexing(tmp_path / "var", database, entries) as (running, _):
            await _settled(chain, running.service, dpnm)
            expected = await expected_of(dpnm, last)
            counters = await running.service.db.read(token_counters, chain.chain_id,
                                                     dpnm.instance.address)
            assert counters.total_active_positions == 4
            assert counters.lifetime_fees_usdt == expected.fees_usdt == 16 * UNIT


async def _final(service: Service, chain_id: int) -> int:
    head = await service.db.read(indexed_head, chain_id)
    assert head is not None and head.final_number is not None
    return head.final_number
