"""Faults stay where they start: an RPC URL answering "the method eth_getLogs does not
exist/is not available" (as free tiers do), behind a proxy in front of anvil. With another URL,
the other URL serves the logs and the counters are exact; as the only URL, the chain's part is
taken down and retried, named in ``/readyz``, while a ``flowsvc serve`` process stays up and
serves every route, that chain's reads included."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import trio

from plugins.chain.indexed import token_counters
from plugins.chain.rpc_errors import redact_url
from runtime.service import Service
from tests.support.chain.actions import buy, join, mine
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, Dpnm, launch_dpnm
from tests.support.chain.indexing import (
    expected_of,
    head_number,
    indexer_env,
    indexing,
    until_final,
)
from tests.support.chain.rpc_proxy import running_proxy
from tests.support.chain.service import chain_entry
from tests.support.processes import serve, stop
from tests.support.projects import eventually
from tests.support.server import client, free_port
from tests.support.wallet import sign_in

UNIT = 10**18


def _sample(metrics: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` whose labels include ``labels`` (0 if none)."""
    for line in metrics.splitlines():
        if line.startswith(name + "{"):
            found = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            if labels.items() <= found.items():
                return float(line.rsplit(" ", 1)[1])
    return 0.0


async def _settled(chain: Chain, service: Service, dpnm: Dpnm) -> None:
    """Mine past finality, wait for it, and check the counters against the logs."""
    last = await head_number(chain.rpc)
    await mine(chain.rpc, 2)
    await until_final(service, chain.chain_id, last, timeout=40)
    expected = await expected_of(dpnm, last)
    counters = await service.db.read(token_counters, chain.chain_id, dpnm.instance.address)
    assert (counters.total_tree_positions, counters.lifetime_fees_usdt) == \
        (expected.tree_positions, expected.fees_usdt)


async def test_a_url_without_eth_getlogs_leaves_the_logs_to_the_other_url(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain) -> None:
    start = await head_number(chain.rpc) + 1
    dpnm = await launch_dpnm(chain, deployment.platform)
    for _ in range(2):
        await buy(dpnm, await join(dpnm, dpnm.root.address, usdt=500 * UNIT), 20 * UNIT)
    async with running_proxy(anvil.url) as refusing, running_proxy(anvil.url) as serving:
        refusing.unsupported = {"eth_getLogs"}
        entries = [chain_entry(deployment.platform, [refusing.url, serving.url],
                               start_block=start, instance=dpnm.instance.address)]
        # The other URL fails at first, so that the refusing one is asked for logs.
        serving.http_status = 502
        async with indexing(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                            entries) as (running, _), client(running) as http:
            service = running.service

            async def refused() -> bool:
                return refusing.methods["eth_getLogs"] > 0

            await eventually(refused, timeout=30)
            serving.http_status = None
            await _settled(chain, service, dpnm)
            asked, served = refusing.methods["eth_getLogs"], serving.methods["eth_getLogs"]
            await buy(dpnm, await join(dpnm, dpnm.root.address, usdt=500 * UNIT), 20 * UNIT)
            await _settled(chain, service, dpnm)
            # Left alone for eth_getLogs since; the other URL served every range.
            assert refusing.methods["eth_getLogs"] == asked
            assert serving.methods["eth_getLogs"] > served
            metrics = (await http.get("/metrics")).text
            assert _sample(metrics, "flowsvc_chain_rpc_unsupported", url=redact_url(refusing.url),
                           method="eth_getLogs") == 1
            ready = await http.get("/readyz")
            assert ready.status_code == 200, ready.text
            assert service.supervisor is not None and service.supervisor.failed_parts() == {}


async def test_no_url_with_eth_getlogs_takes_the_chain_down_not_the_service(
        tmp_path: Path, anvil: Anvil, deployment: Deployment) -> None:
    name = f"chain{deployment.platform.chain_id}"
    part = f"part:chain.{name}"
    async with running_proxy(anvil.url) as proxy:
        proxy.unsupported = {"eth_getLogs"}
        env = {**indexer_env(tmp_path / "var", f"sqlite:///{tmp_path / 'db.sqlite'}",
                             [chain_entry(deployment.platform, [proxy.url], name=name,
                                          instance=deployment.dpnm.instance)]),
               "FLOWSVC_SUPERVISOR_PART_RETRY_SECONDS": "0.5"}
        port = free_port()
        process = await trio.to_thread.run_sync(serve, env, port)
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                         timeout=30) as http:

                async def retried_past_the_root_intensity() -> bool:
                    metrics = (await http.get("/metrics")).text
                    # The root allows 5 restarts within 30 s; formerly the service exited.
                    return _sample(metrics, "flowsvc_actor_restarts_total",
                                   actor=f"chain.indexer.{name}") > 5 and _sample(
                        metrics, "flowsvc_part_failures_total", part=f"chain.{name}") >= 2

                await eventually(retried_past_the_root_intensity, timeout=60)
                assert process.poll() is None

                ready: dict[str, Any] = {}

                async def named_in_readyz() -> bool:
                    response = await http.get("/readyz")
                    ready.update(response.json())  # kept: the part may be retried meanwhile
                    return response.status_code == 200 and part in ready["checks"]

                await eventually(named_in_readyz, timeout=30)
                assert "no RPC URL serves eth_getLogs" not in str(ready)  # the log has it
                assert ready["checks"][part]["error"].startswith(
                    f"down: actor chain.indexer.{name} crashed")
                assert ready["status"] == "degraded"  # 200: a balancer keeps it
                # Every route serves, this chain's reads (eth_call) included.
                assert (await http.get("/healthz")).status_code == 200
                await sign_in(http)
                onchain = await http.get("/me/flow-onchain")
                assert onchain.status_code == 200, onchain.text
                assert onchain.json()["unavailable"] == []
                metrics = (await http.get("/metrics")).text
                assert _sample(metrics, "flowsvc_chain_rpc_unsupported", chain=name,
                               url=redact_url(proxy.url), method="eth_getLogs") == 1
        finally:
            [output] = await trio.to_thread.run_sync(stop, [process])
    assert process.returncode == 0, output[-3000:]
    assert output.count("does not serve eth_getLogs") == 1  # logged once, not per retry
    assert f"part chain.{name} is down" in output and f"part chain.{name} starts again" in output
    assert "supervisor gives up:" not in output
