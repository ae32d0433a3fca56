"""The RPC pool against fake JSON-RPC nodes on loopback: failover, cooldown and recovery,
deadlines and cancellation, chain ids, lagging heads.

Cooldown tests run on pytest-trio's ``mock_clock`` (time stands still unless the test jumps
it), so they assert exact cooldowns; deadline tests run on the real clock with wide margins.
"""

from __future__ import annotations

import math
import time
from email.utils import formatdate

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry
from trio.testing import MockClock

from plugins.chain.health import CooldownPolicy
from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import ChainIdMismatch, RpcUnavailable
from plugins.chain.rpc_metrics import RpcMetrics
from tests.plugins.chain.fake_node import Answer, FakeNode, make_pool, serving, soon
from tests.support.server import free_port


async def test_a_call_is_answered_by_the_first_url(client: httpx.AsyncClient) -> None:
    first, second = FakeNode(head=100), FakeNode(head=200)
    async with serving(first, second):
        pool = make_pool(client, first, second)
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(100)
    assert len(first.requests) == 1 and second.requests == []


async def test_a_500_fails_over_to_the_next_url_and_cools_the_first(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    first, second = FakeNode(head=100), FakeNode(head=200)
    first.script = [Answer(status=500)]
    async with serving(first, second):
        pool = make_pool(client, first, second, cooldown=CooldownPolicy(base=2.0))
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(200)
        assert not pool.endpoints[0].health.available(trio.current_time())
        assert 1.0 <= pool.endpoints[0].health.cooling_until - trio.current_time() <= 2.0
        # While it cools, calls go to the second URL only.
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(200)
        assert len(first.requests) == 1
        # Recovered: usable again, so when the second URL fails the first one answers.
        mock_clock.jump(2.01)
        assert pool.endpoints[0].health.available(trio.current_time())
        second.script = [Answer(status=500)]
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(100)
        assert pool.endpoints[0].health.consecutive_failures == 0


async def test_429_cools_down_for_exactly_retry_after(client: httpx.AsyncClient,
                                                      mock_clock: MockClock) -> None:
    first, second = FakeNode(head=100), FakeNode(head=200)
    first.script = [Answer(status=429, headers={"Retry-After": "7"})]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(200)
        assert pool.endpoints[0].health.cooling_until == trio.current_time() + 7
        mock_clock.jump(6.9)
        second.script = [Answer(status=500)]
        with pytest.raises(RpcUnavailable):  # the first URL still cools: nothing left
            await pool.call("eth_blockNumber", [], deadline=soon())
        assert len(first.requests) == 1
        mock_clock.jump(0.2)
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(100)


async def test_retry_after_as_a_date_and_its_cap(client: httpx.AsyncClient,
                                                 mock_clock: MockClock) -> None:
    first, second = FakeNode(), FakeNode()
    first.script = [Answer(status=429, headers={"Retry-After": formatdate(time.time() + 30,
                                                                          usegmt=True)})]
    second.script = [Answer(status=429, headers={"Retry-After": "86400"})]
    async with serving(first, second):
        pool = make_pool(client, first, second, cooldown=CooldownPolicy(retry_after_cap=600))
        with pytest.raises(RpcUnavailable) as raised:
            await pool.call("eth_blockNumber", [], deadline=soon())
    now = trio.current_time()
    assert 27 <= pool.endpoints[0].health.cooling_until - now <= 31
    assert pool.endpoints[1].health.cooling_until - now == 600
    assert raised.value.retry_after is not None and 27 <= raised.value.retry_after <= 31


async def test_cooldowns_back_off_exponentially_up_to_the_cap(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    node = FakeNode()
    node.script = [Answer(status=503)] * 5
    async with serving(node):
        pool = make_pool(client, node, cooldown=CooldownPolicy(base=1.0, cap=4.0))
        health = pool.endpoints[0].health
        for ceiling in (1.0, 2.0, 4.0, 4.0, 4.0):
            with pytest.raises(RpcUnavailable):
                await pool.call("eth_chainId", [], deadline=soon())
            cooldown = health.cooling_until - trio.current_time()
            assert ceiling / 2 <= cooldown <= ceiling
            # Every URL cooling: fail fast, without a request, saying when to come back.
            with pytest.raises(RpcUnavailable, match="cooling down") as raised:
                await pool.call("eth_chainId", [], deadline=soon())
            assert raised.value.retry_after == pytest.approx(cooldown)
            mock_clock.jump(cooldown)
        assert len(node.requests) == 5
        assert await pool.call("eth_chainId", [], deadline=soon()) == hex(56)
        assert health.consecutive_failures == 0 and health.failures == 5


async def test_a_transport_error_fails_over_and_messages_carry_no_secret(
        client: httpx.AsyncClient) -> None:
    closed_port = free_port()  # nothing listens on it
    secret_url = f"http://user:hunter2@127.0.0.1:{closed_port}/v2/abcdefghijklmnop0123?key=s3cr3t"
    node = FakeNode(head=5)
    async with serving(node):
        pool = RpcPool([secret_url, node.url()], client, chain="test")
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(5)
        pool_down = RpcPool([secret_url], client, chain="test")
        with pytest.raises(RpcUnavailable) as raised:
            await pool_down.call("eth_blockNumber", [], deadline=soon())
    message = str(raised.value)
    assert f"http://***@127.0.0.1:{closed_port}/v2/***?***" in message
    assert "ConnectError" in message
    for secret in ("user", "hunter2", "abcdefghijklmnop0123", "s3cr3t"):
        assert secret not in message


async def test_a_stalled_url_times_out_and_the_next_answers(client: httpx.AsyncClient) -> None:
    first, second = FakeNode(head=1), FakeNode(head=2)
    first.script = [Answer(delay=60)]
    async with serving(first, second):
        pool = make_pool(client, first, second, attempt_timeout=0.5)
        started = time.monotonic()
        assert await pool.call("eth_blockNumber", [], deadline=soon(30)) == hex(2)
        assert time.monotonic() - started < 15
    assert not pool.endpoints[0].health.available(trio.current_time())


async def test_the_deadline_bounds_a_call_when_every_url_stalls(
        client: httpx.AsyncClient) -> None:
    first, second = FakeNode(), FakeNode()
    first.script, second.script = [Answer(delay=60)], [Answer(delay=60)]
    async with serving(first, second):
        pool = make_pool(client, first, second, attempt_timeout=20)
        started = time.monotonic()
        with pytest.raises(RpcUnavailable, match="no answer before the deadline"):
            await pool.call("eth_blockNumber", [], deadline=soon(1.0))
        elapsed = time.monotonic() - started
    # The first URL used the whole second; the second URL was never reached.
    assert 0.9 <= elapsed < 15
    assert second.requests == []


async def test_cancellation_is_honoured_and_does_not_count_against_the_url(
        client: httpx.AsyncClient) -> None:
    node = FakeNode()
    node.script = [Answer(delay=60)]
    async with serving(node):
        pool = make_pool(client, node)
        started = time.monotonic()
        with trio.move_on_after(0.3) as scope:
            await pool.call("eth_blockNumber", [], deadline=soon(60))
        assert scope.cancelled_caught
        assert time.monotonic() - started < 15
    assert pool.endpoints[0].health.requests == 0


async def test_chain_id_mismatch_names_the_redacted_url_and_the_ids(
        client: httpx.AsyncClient) -> None:
    right, wrong = FakeNode(chain_id=56), FakeNode(chain_id=97)
    async with serving(right, wrong):
        wrong_url = f"http://key:secret@127.0.0.1:{wrong.port}/v3/0123456789abcdef0123?token=x"
        pool = RpcPool([right.url(), wrong_url], client, chain="bsc")
        with pytest.raises(ChainIdMismatch) as raised:
            await pool.check_chain_ids(56, deadline=soon())
        message = str(raised.value)
        assert f"http://***@127.0.0.1:{wrong.port}/v3/***?***" in message
        assert "97" in message and "56" in message
        assert "secret" not in message and "0123456789abcdef0123" not in message
        assert raised.value.mismatches == [(pool.endpoints[1].label, 97)]
        # The wrong URL is never used again.
        for _ in range(3):
            assert await pool.call("eth_chainId", [], deadline=soon()) == hex(56)
    assert wrong.methods() == ["eth_chainId"]


async def test_a_url_unreachable_at_the_check_is_checked_before_its_first_use(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    wrong, right = FakeNode(chain_id=97, head=1), FakeNode(chain_id=56, head=2)
    wrong.script, right.script = [Answer(status=502)], [Answer(status=502)]
    async with serving(wrong, right):
        pools = [make_pool(client, node) for node in (wrong, right)]
        for pool in pools:
            assert await pool.check_chain_ids(56, deadline=soon()) == [pool.endpoints[0].label]
        mock_clock.jump(60)
        with pytest.raises(RpcUnavailable, match="serves chain id 97"):
            await pools[0].call("eth_blockNumber", [], deadline=soon())
        assert await pools[1].call("eth_blockNumber", [], deadline=soon()) == hex(2)
        # Checked once: later calls go straight to the method.
        assert await pools[1].call("eth_blockNumber", [], deadline=soon()) == hex(2)
    assert pools[0].endpoints[0].health.cooling_until == math.inf
    assert wrong.methods() == ["eth_chainId", "eth_chainId"]
    assert right.methods() == ["eth_chainId", "eth_chainId", "eth_blockNumber",
                               "eth_blockNumber"]


async def test_head_skips_a_lagging_node_and_counts_it(client: httpx.AsyncClient,
                                                       mock_clock: MockClock) -> None:
    # The clock stands still, so latencies tie and the configured order decides.
    lagging, synced = FakeNode(head=90), FakeNode(head=120)
    registry = CollectorRegistry()
    async with serving(lagging, synced):
        pool = make_pool(client, lagging, synced,
                         observer=RpcMetrics(registry).for_chain("bsc"))
        assert await pool.head(None, deadline=soon()) == 90
        assert await pool.head(100, deadline=soon()) == 120
    assert not pool.endpoints[0].health.available(trio.current_time())
    labels = {"chain": "bsc", "url": pool.endpoints[0].label, "method": "eth_blockNumber"}
    assert registry.get_sample_value("flowsvc_chain_rpc_requests_total",
                                     {**labels, "outcome": "lagging"}) == 1
    assert registry.get_sample_value("flowsvc_chain_rpc_requests_total",
                                     {**labels, "outcome": "ok"}) == 1
    assert registry.get_sample_value("flowsvc_chain_rpc_seconds_count", labels) == 2


def test_a_pool_needs_a_url() -> None:
    with pytest.raises(ValueError, match="no RPC URL"):
        RpcPool([], httpx.AsyncClient(), chain="bsc")
