"""One URL's answers through the pool: deterministic, transient and range errors, batches
matched by id, and what the metrics count."""

from __future__ import annotations

import gc
from functools import partial
from typing import Any

import httpx
import pytest
import trio
from prometheus_client import CollectorRegistry

from plugins.chain.rpc import RpcPool
from plugins.chain.rpc_errors import (
    ExecutionReverted,
    LogRangeTooLarge,
    RpcDeterministicError,
    RpcUnavailable,
)
from plugins.chain.rpc_metrics import RpcMetrics
from tests.plugins.chain.fake_node import Answer, FakeNode, make_pool, serving, soon, wider_than


@pytest.mark.parametrize(("error", "kind"), [
    ({"code": 3, "message": "execution reverted: not activated", "data": "0x08c379a0"},
     ExecutionReverted),
    ({"code": -32000, "message": "execution reverted"}, ExecutionReverted),
    ({"code": -32602, "message": "invalid params"}, RpcDeterministicError),
    ({"code": -32000, "message": "invalid argument 0: hex string without 0x prefix"},
     RpcDeterministicError),
])
async def test_deterministic_errors_are_raised_at_once_and_never_retried(
        client: httpx.AsyncClient, error: dict[str, Any], kind: type[Exception]) -> None:
    first, second = FakeNode(errors={"eth_call": error}), FakeNode(errors={"eth_call": error})
    async with serving(first, second):
        pool = make_pool(client, first, second)
        with pytest.raises(kind) as raised:
            await pool.call("eth_call", [{"to": "0x" + "11" * 20, "data": "0x"}, "latest"],
                            deadline=soon())
    assert isinstance(raised.value, RpcDeterministicError)
    assert raised.value.code == error["code"] and raised.value.data == error.get("data")
    assert len(first.requests) == 1 and second.requests == []
    assert pool.endpoints[0].health.available(trio.current_time())


async def test_a_json_rpc_error_in_a_4xx_is_classified_by_its_code(
        client: httpx.AsyncClient) -> None:
    first, second = FakeNode(), FakeNode()
    first.script = [Answer(status=400, body={"jsonrpc": "2.0", "id": None, "error": {
        "code": -32602, "message": "invalid params"}})]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        with pytest.raises(RpcDeterministicError):
            await pool.call("eth_getBalance", ["0x1"], deadline=soon())
    assert second.requests == []


@pytest.mark.parametrize("answer", [
    Answer(body={"jsonrpc": "2.0", "id": 999, "result": "0x1"}),  # another id
    Answer(body=["not", "an", "object"]),
    Answer(status=404, body={"detail": "no such path"}),
    Answer(body={"jsonrpc": "2.0", "id": 1, "error": {"code": -32000,
                                                      "message": "header not found"}}),
    Answer(body={"jsonrpc": "2.0", "id": 1, "error": {"code": -32005,
                                                      "message": "limit exceeded"}}),
])
async def test_transient_answers_fail_over(client: httpx.AsyncClient, answer: Answer) -> None:
    first, second = FakeNode(head=1), FakeNode(head=2)
    first.script = [answer]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        assert await pool.call("eth_blockNumber", [], deadline=soon()) == hex(2)
    assert not pool.endpoints[0].health.available(trio.current_time())


async def test_batch_answers_are_matched_by_id_even_out_of_order(
        client: httpx.AsyncClient) -> None:
    node = FakeNode(chain_id=97, head=42, reverse_batches=True,
                    errors={"eth_call": {"code": -32602, "message": "invalid params"}})
    async with serving(node):
        pool = make_pool(client, node)
        answers = await pool.batch([("eth_chainId", []), ("eth_blockNumber", []),
                                    ("eth_call", [])], deadline=soon())
    assert [answer.result for answer in answers[:2]] == [hex(97), hex(42)]
    assert isinstance(answers[2].error, RpcDeterministicError)
    with pytest.raises(RpcDeterministicError):
        answers[2].unwrap()
    assert answers[0].unwrap() == hex(97)
    assert len(node.requests) == 1 and isinstance(node.requests[0], list)


async def test_an_empty_batch_sends_nothing(client: httpx.AsyncClient) -> None:
    node = FakeNode()
    async with serving(node):
        assert await make_pool(client, node).batch([], deadline=soon()) == []
    assert node.requests == []


async def test_a_transient_item_fails_the_whole_batch_over(client: httpx.AsyncClient) -> None:
    first = FakeNode(head=1, errors={"eth_blockNumber": {"code": -32000,
                                                         "message": "header not found"}})
    second = FakeNode(head=2)
    async with serving(first, second):
        pool = make_pool(client, first, second)
        answers = await pool.batch([("eth_chainId", []), ("eth_blockNumber", [])],
                                   deadline=soon())
    assert [answer.unwrap() for answer in answers] == [hex(56), hex(2)]
    assert len(first.requests) == len(second.requests) == 1


@pytest.mark.parametrize("body", [
    [{"jsonrpc": "2.0", "id": 12345, "result": "0x1"}],  # ids that were not asked
    {"jsonrpc": "2.0", "id": None, "error": {"code": -32603, "message": "batch too large"}},
])
async def test_a_broken_batch_answer_fails_over(client: httpx.AsyncClient, body: Any) -> None:
    first, second = FakeNode(), FakeNode(head=2)
    first.script = [Answer(body=body)]
    async with serving(first, second):
        pool = make_pool(client, first, second)
        answers = await pool.batch([("eth_blockNumber", [])], deadline=soon())
    assert answers[0].unwrap() == hex(2)


async def test_metrics_count_requests_and_errors_per_url_and_method(
        client: httpx.AsyncClient) -> None:
    first, second = FakeNode(), FakeNode()
    first.script = [Answer(status=500)]
    registry = CollectorRegistry()
    metrics = RpcMetrics(registry)
    async with serving(first, second):
        pool = make_pool(client, first, second, observer=metrics.for_chain("bsc"))
        await pool.call("eth_chainId", [], deadline=soon())
        await pool.batch([("eth_chainId", [])], deadline=soon())

    def count(endpoint: int, method: str, outcome: str) -> float | None:
        return registry.get_sample_value("flowsvc_chain_rpc_requests_total", {
            "chain": "bsc", "url": pool.endpoints[endpoint].label, "method": method,
            "outcome": outcome})

    assert count(0, "eth_chainId", "http_error") == 1
    assert count(1, "eth_chainId", "ok") == 1
    assert count(1, "batch", "ok") == 1
    # A second chain shares the collectors through its own label.
    metrics.for_chain("base").observe("u", "eth_call", "ok", 0.01)
    assert registry.get_sample_value("flowsvc_chain_rpc_requests_total", {
        "chain": "base", "url": "u", "method": "eth_call", "outcome": "ok"}) == 1


async def test_a_range_error_is_raised_without_cooling_or_failing_over(
        client: httpx.AsyncClient) -> None:
    def alchemy(start: int, end: int) -> dict[str, Any]:
        return {"code": -32602, "message": "Log response size exceeded. this block range "
                f"should work: [{hex(start)}, {hex(start + 9)}]"}

    first = FakeNode(refuses=wider_than(10), range_error=alchemy)
    second = FakeNode()
    async with serving(first, second):
        pool = make_pool(client, first, second)
        with pytest.raises(LogRangeTooLarge) as raised:
            await pool.call("eth_getLogs", [{"fromBlock": "0x0", "toBlock": "0x63"}],
                            deadline=soon())
    assert raised.value.hint.blocks == 10 and not raised.value.hint.is_limit
    assert raised.value.url == pool.endpoints[0].label
    assert pool.endpoints[0].health.available(trio.current_time())
    assert second.requests == []


async def test_a_request_cancelled_while_sending_leaves_nothing_unfinished(
        client: httpx.AsyncClient) -> None:
    async def never_reads(stream: trio.SocketStream) -> None:
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, never_reads, 0,
                                                host="127.0.0.1"))
        pool = RpcPool([f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}/"], client,
                       attempt_timeout=0.3)
        # A body far larger than the socket buffers: the deadline strikes mid-send.
        with pytest.raises(RpcUnavailable, match="deadline"):
            await pool.call("eth_call", ["0x" + "00" * 10_000_000], deadline=soon())
        # An unfinished body stream would warn here (warnings are errors in this suite).
        gc.collect()
        nursery.cancel_scope.cancel()
