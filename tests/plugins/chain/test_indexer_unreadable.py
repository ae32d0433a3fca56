"""A registered dpnm token whose instance is no dpnm instance (an EOA, Multicall3) is marked
unreadable: the service stays up, ``/readyz`` and the metrics name it, its on-chain endpoint
answers ``token_unreadable``, and the chain's other tokens keep indexing, across restarts."""

from __future__ import annotations

from pathlib import Path

import httpx

from plugins.chain.indexed import token_counters
from plugins.chain.indexer.final import token_slug
from runtime.server import Running
from tests.support.chain.actions import buy, join, mine
from tests.support.chain.anvil import Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import Deployment, launch_dpnm
from tests.support.chain.indexing import (
    expected_of,
    head_number,
    indexer_state,
    indexing,
    until_final,
)
from tests.support.chain.service import chain_entry
from tests.support.projects import eventually
from tests.support.server import INTERNAL, client

UNIT = 10**18


async def _register(running: Running, slug: str, chain_id: int, instance: str) -> None:
    async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as internal:
        put = await internal.put(f"/internal/tokens/{slug}", headers=INTERNAL, json={
            "ownerAddress": "0x" + "11" * 20, "template": "dpnm", "chainId": chain_id,
            "instance": instance})
    assert put.status_code == 201, put.text


async def _unreadable(running: Running) -> dict[str, str]:
    async with client(running) as http:
        ready = await http.get("/readyz")
    assert ready.status_code == 200, ready.text
    [details] = ready.json()["checks"]["chain_indexers"]["chains"].values()
    assert details["state"] == "indexing"
    unreadable: dict[str, str] = details["unreadable"]
    return unreadable


async def test_a_token_on_an_address_that_is_no_flow_instance_is_unreadable(
        tmp_path: Path, anvil: Anvil, deployment: Deployment, chain: Chain,
        database_url: str) -> None:
    dpnm = await launch_dpnm(chain, deployment.platform)  # a good token, launched
    user = await join(dpnm, dpnm.root.address, usdt=500 * UNIT)
    later = await join(dpnm, user.address, usdt=500 * UNIT)
    eoa = (await chain.new_account()).address.lower()
    multicall = deployment.platform.multicall.lower()
    good = token_slug("dpnm", chain.chain_id, dpnm.instance.address)
    # The registry read every 0.2 s (5 s by default): a registration is checked at once.
    entries = [chain_entry(deployment.platform, [anvil.url],
                           instance=deployment.dpnm.instance, registry_interval_seconds=0.2)]
    async with indexing(tmp_path / "var", database_url, entries) as (running, _), \
            client(running) as http:
        service = running.service
        await until_final(service, chain.chain_id, await head_number(chain.rpc) - 2)
        await _register(running, "multicall", chain.chain_id, multicall)  # reverts
        await _register(running, "wallet", chain.chain_id, eoa)  # answers nothing

        async def both_named() -> bool:
            return set(await _unreadable(running)) == {"multicall", "wallet"}

        await eventually(both_named, timeout=20)
        assert multicall in (await _unreadable(running))["multicall"]
        metrics = (await http.get("/metrics")).text
        assert f'flowsvc_chain_unreadable_tokens{{chain="chain{chain.chain_id}"}} 2.0' in metrics
        for slug in ("multicall", "wallet"):
            refused = await http.get(f"/tokens/{slug}/onchain")
            assert refused.status_code == 409, refused.text
            assert refused.json()["error"]["code"] == "token_unreadable"

        # A registration changed while the service runs is checked again, the old one
        # forgotten (here the slug moves to another address that is no instance either).
        eoa = (await chain.new_account()).address.lower()
        async with httpx.AsyncClient(base_url=running.base_url, timeout=30) as internal:
            moved = await internal.put("/internal/tokens/wallet", headers=INTERNAL, json={
                "ownerAddress": "0x" + "11" * 20, "template": "dpnm",
                "chainId": chain.chain_id, "instance": eoa})
        assert moved.status_code == 200, moved.text

        async def moved_named() -> bool:
            return eoa in (await _unreadable(running)).get("wallet", "")

        await eventually(moved_named, timeout=20)
        assert set(await _unreadable(running)) == {"multicall", "wallet"}
        metrics = (await http.get("/metrics")).text
        assert f'flowsvc_chain_unreadable_tokens{{chain="chain{chain.chain_id}"}} 2.0' in metrics

        # The chain's other tokens keep indexing.
        await buy(dpnm, user, 40 * UNIT)
        last = await head_number(chain.rpc)
        await mine(chain.rpc, 2)
        await until_final(service, chain.chain_id, last)
        expected = await expected_of(dpnm, last)
        counters = await service.db.read(token_counters, chain.chain_id, dpnm.instance.address)
        assert counters.lifetime_fees_usdt == expected.fees_usdt == 8 * UNIT
        onchain = await http.get(f"/tokens/{good}/onchain")
        assert onchain.status_code == 200, onchain.text
        assert onchain.json()["lifetimeFeesUsdt"] == "8"
        assert indexer_state(service, chain.chain_id) == "indexing"

    # A restart reads the registry at start: still no crash, the same tokens named.
    async with indexing(tmp_path / "var", database_url, entries) as (running, _):
        await buy(dpnm, later, 25 * UNIT)
        last = await head_number(chain.rpc)
        await mine(chain.rpc, 2)
        await until_final(running.service, chain.chain_id, last)
        assert set(await _unreadable(running)) == {"multicall", "wallet"}
        counters = await running.service.db.read(token_counters, chain.chain_id,
                                                 dpnm.instance.address)
        assert counters.lifetime_fees_usdt == 13 * UNIT
