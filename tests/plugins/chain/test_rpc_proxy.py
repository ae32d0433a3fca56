"""The faulty JSON-RPC proxy of tests.support.chain.rpc_proxy injects each fault on demand."""

from __future__ import annotations

from collections import Counter

import httpx
import pytest

from tests.support.chain.actions import mine
from tests.support.chain.anvil import DEFAULT_CHAIN_ID, Anvil
from tests.support.chain.contracts import Chain
from tests.support.chain.deploy import UNIT, Deployment
from tests.support.chain.rpc import Rpc, RpcError
from tests.support.chain.rpc_proxy import LOGS_ERRORS, running_proxy


async def test_logs_beyond_the_range_limit_fail_in_each_provider_style(
        anvil: Anvil, chain: Chain, deployment: Deployment) -> None:
    await mine(chain.rpc, 10)
    receipt = await chain.contract("Token", deployment.platform.usdt).transact(
        chain.deployer, "mint", chain.deployer.address, UNIT)
    head = receipt.block_number
    async with running_proxy(anvil.url) as proxy, Rpc(proxy.url) as rpc:
        proxy.logs_range_limit = 5
        wide = {"fromBlock": hex(head - 9), "toBlock": hex(head)}
        suggested = f"[{hex(head - 9)}, {hex(head - 5)}]"
        expected = {"alchemy": (-32602, f"this block range should work: {suggested}"),
                    "infura": (-32005, f"Try with this block range {suggested}."),
                    "quicknode": (-32614, "eth_getLogs is limited to a 5 range"),
                    "base": (-32000, "block range too large"),
                    "llamarpc": (-32000, "query exceeds max results 20000")}
        assert expected.keys() == LOGS_ERRORS.keys()
        for style, (code, text) in expected.items():
            proxy.logs_error_style = style
            with pytest.raises(RpcError) as refused:
                await rpc.call("eth_getLogs", wide)
            assert refused.value.code == code
            assert text in refused.value.message, style

        # Within the limit, by block hash, and beside a refused query in a batch: real answers.
        narrow = await rpc.call("eth_getLogs", {"fromBlock": hex(head - 4), "toBlock": "latest"})
        by_hash = await rpc.call("eth_getLogs", {"blockHash": receipt.block_hash})
        assert narrow == by_hash == receipt.logs
        refused_logs, number = await rpc.batch([("eth_getLogs", [{"fromBlock": "earliest"}]),
                                                ("eth_blockNumber", [])])
        assert isinstance(refused_logs, RpcError)
        assert refused_logs.message == "query exceeds max results 20000"
        assert int(number, 16) == head


async def test_http_errors_stalls_and_a_dead_proxy(anvil: Anvil) -> None:
    async with running_proxy(anvil.url) as proxy, Rpc(proxy.url) as rpc:
        proxy.http_status = 429
        with pytest.raises(httpx.HTTPStatusError) as limited:
            await rpc.call("eth_chainId")
        assert limited.value.response.status_code == 429
        assert limited.value.response.headers["retry-after"] == "1"
        proxy.http_status = 502
        with pytest.raises(httpx.HTTPStatusError) as gateway:
            await rpc.call("eth_chainId")
        assert gateway.value.response.status_code == 502
        proxy.http_status = None

        proxy.stall_seconds = 10
        async with Rpc(proxy.url, timeout=0.5) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                await impatient.call("eth_chainId")
        proxy.stall_seconds = 0
        assert await rpc.call("eth_chainId") == hex(DEFAULT_CHAIN_ID)

        url = proxy.url
        await proxy.set_down(True)
        with pytest.raises(httpx.ConnectError):
            await rpc.call("eth_chainId")
        await proxy.set_down(False)
        assert proxy.url == url
        assert await rpc.call("eth_chainId") == hex(DEFAULT_CHAIN_ID)


async def test_a_lagging_head_and_request_counts(anvil: Anvil, chain: Chain) -> None:
    await mine(chain.rpc, 5)
    real = int(await chain.rpc.call("eth_blockNumber"), 16)
    async with running_proxy(anvil.url) as proxy, Rpc(proxy.url) as rpc:
        proxy.head_lag = 3
        number, latest = await rpc.batch([("eth_blockNumber", []),
                                          ("eth_getBlockByNumber", ["latest", False])])
        assert (int(number, 16), int(latest["number"], 16)) == (real - 3, real - 3)
        assert await rpc.call("eth_getBlockByNumber", hex(real), False) is not None

        assert (proxy.methods, proxy.http_requests) == (
            Counter({"eth_blockNumber": 1, "eth_getBlockByNumber": 2}), 2)


async def test_an_unsupported_method_is_refused_as_geth_does(anvil: Anvil) -> None:
    async with running_proxy(anvil.url) as proxy, Rpc(proxy.url) as rpc:
        proxy.unsupported = {"eth_getLogs"}
        with pytest.raises(RpcError) as refused:
            await rpc.call("eth_getLogs", {"fromBlock": "earliest"})
        assert refused.value.code == -32601
        assert refused.value.message == "the method eth_getLogs does not exist/is not available"
        assert await rpc.call("eth_chainId") == hex(DEFAULT_CHAIN_ID)
