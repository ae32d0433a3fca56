"""anvil processes from tests.support.chain.anvil: several chains at once, each its own."""

from __future__ import annotations

from tests.support.chain.actions import wait_for_block
from tests.support.chain.anvil import open_anvil
from tests.support.chain.rpc import Rpc


async def test_two_chains_run_at_once_with_their_own_ids_and_block_times() -> None:
    async with open_anvil(56, block_time=1) as bsc, open_anvil(97) as testnet, \
            Rpc(bsc.url) as bsc_rpc, Rpc(testnet.url) as testnet_rpc:
        assert bsc.port != testnet.port
        assert [await bsc_rpc.call("eth_chainId"), await testnet_rpc.call("eth_chainId")] == [
            hex(56), hex(97)]
        # Interval mining makes blocks with no transaction; automine makes none.
        await wait_for_block(bsc_rpc, 2)
        assert await testnet_rpc.call("eth_blockNumber") == "0x0"
    assert bsc.process.poll() is not None
    assert testnet.process.poll() is not None
