"""A URL that does not serve a method (many free tiers refuse ``eth_getLogs``): the method goes
to the other URLs for a long time (logged once, in metrics), the URL keeps serving the rest,
and when no URL serves it the pool says so (``MethodUnsupported``), never a transient outage."""

from __future__ import annotations

import logging
from typing import Any

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry
from trio.testing import MockClock

from plugins.chain.health import CooldownPolicy
from plugins.chain.rpc_errors import MethodUnsupported, RpcUnavailable
from plugins.chain.rpc_metrics import RpcMetrics
from tests.plugins.chain.fake_node import Answer, FakeNode, make_pool, serving, soon

NOT_AVAILABLE = {"code": -32000, "message": "the method eth_getLogs does not exist/is not "
                                            "available"}
LOGS = [{"fromBlock": "0x1", "toBlock": "0x2"}]


def _unsupported(registry: CollectorRegistry, url: str, method: str) -> float | None:
    return registry.get_sample_value("flowsvc_chain_rpc_unsupported",
                                     {"chain": "test", "url": url, "method": method})


async def test_a_method_one_url_refuses_goes_to_the_other_url(
        client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture) -> None:
    first, second = FakeNode(errors={"eth_getLogs": NOT_AVAILABLE}), FakeNode(head=7)
    registry = CollectorRegistry()
    async with serving(first, second):
        pool = make_pool(client, first, second,
                         observer=RpcMetrics(registry).for_chain("test"))
        label = pool.endpoints[0].label
        for _ in range(3):
            assert len(await pool.call("eth_getLogs", LOGS, deadline=soon())) == 2
        # Asked once: afterwards the pool skips it for that method, without a request...
        assert first.methods() == ["eth_getLogs"]
        assert second.methods().count("eth_getLogs") == 3
        # ...and it is not cooled down: it still serves the methods it has.
        assert pool.endpoints[0].health.available(trio.current_time())
        first.head, second.script = 5, [Answer(status=500)]
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(5)
    assert _unsupported(registry, label, "eth_getLogs") == 1
    assert registry.get_sample_value("flowsvc_chain_rpc_requests_total", {
        "chain": "test", "url": label, "method": "eth_getLogs", "outcome": "unsupported"}) == 1
    warnings = [record for record in caplog.records if "does not serve" in record.getMessage()]
    assert len(warnings) == 1 and label in warnings[0].getMessage()
    assert warnings[0].levelno == logging.WARNING


async def test_no_url_serving_a_method_is_method_unsupported_not_an_outage(
        client: httpx.AsyncClient) -> None:
    first = FakeNode(errors={"eth_getLogs": NOT_AVAILABLE})
    second = FakeNode(errors={"eth_getLogs": {"code": -32601, "message": "Method not found"}})
    async with serving(first, second):
        pool = make_pool(client, first, second)
        with pytest.raises(MethodUnsupported) as raised:
            await pool.call("eth_getLogs", LOGS, deadline=soon())
        assert raised.value.method == "eth_getLogs"
        assert "chain test: no RPC URL serves eth_getLogs" in str(raised.value)
        assert not isinstance(raised.value, RpcUnavailable)  # not waited out as an outage
        with pytest.raises(MethodUnsupported):  # known now: no request at all
            await pool.call("eth_getLogs", LOGS, deadline=soon())
    assert first.methods() == second.methods() == ["eth_getLogs"]


async def test_one_url_refusing_and_the_other_down_is_an_outage(
        client: httpx.AsyncClient) -> None:
    """The other URL may come back: this is an outage to wait out, not a missing method."""
    first, second = FakeNode(errors={"eth_getLogs": NOT_AVAILABLE}), FakeNode()
    second.script = [Answer(status=502)]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        with pytest.raises(RpcUnavailable):
            await pool.call("eth_getLogs", LOGS, deadline=soon())


@pytest.mark.parametrize("status", [403, 405])
async def test_http_403_or_405_refuses_the_method(client: httpx.AsyncClient,
                                                   status: int) -> None:
    first, second = FakeNode(), FakeNode()
    first.script = [Answer(status=status, body={"detail": "not on your plan"})]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        assert len(await pool.call("eth_getLogs", LOGS, deadline=soon())) == 2
        assert not pool.endpoints[0].health.supports("eth_getLogs", trio.current_time())
        assert pool.endpoints[0].health.supports("eth_blockNumber", trio.current_time())


async def test_a_batch_with_a_refused_item_goes_whole_to_another_url(
        client: httpx.AsyncClient) -> None:
    first, second = FakeNode(errors={"eth_getLogs": NOT_AVAILABLE}), FakeNode(head=9)
    calls: list[tuple[str, list[Any]]] = [("eth_blockNumber", []), ("eth_getLogs", LOGS)]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        for _ in range(2):
            answers = await pool.batch(calls, deadline=soon())
            assert answers[0].unwrap() == hex(9) and len(answers[1].unwrap()) == 2
    assert len(first.requests) == 1  # the second batch skipped it


async def test_the_mark_expires_and_the_url_is_asked_again(
        client: httpx.AsyncClient, mock_clock: MockClock) -> None:
    first, second = FakeNode(errors={"eth_getLogs": NOT_AVAILABLE}), FakeNode()
    registry = CollectorRegistry()
    async with serving(first, second):
        pool = make_pool(client, first, second, cooldown=CooldownPolicy(unsupported_seconds=600),
                         observer=RpcMetrics(registry).for_chain("test"))
        await pool.call("eth_getLogs", LOGS, deadline=soon())
        mock_clock.jump(599)
        await pool.call("eth_getLogs", LOGS, deadline=soon())
        assert first.methods() == ["eth_getLogs"]
        mock_clock.jump(2)
        del first.errors["eth_getLogs"]  # the plan changed
        second.script = [Answer(status=500)]
        assert len(await pool.call("eth_getLogs", LOGS, deadline=soon())) == 2
        assert first.methods() == ["eth_getLogs", "eth_getLogs"]
    assert _unsupported(registry, pool.endpoints[0].label, "eth_getLogs") == 0
