"""Classification of JSON-RPC errors, and URL redaction."""

from __future__ import annotations

from typing import Any

import pytest

from plugins.chain.rpc_errors import (
    ChainIdMismatch,
    ExecutionReverted,
    LogRangeTooLarge,
    MethodUnsupported,
    RpcDeterministicError,
    RpcTransientError,
    RpcUnavailable,
    classify_error,
    redact_url,
)
from runtime.errors import is_outage


@pytest.mark.parametrize(("method", "error", "kind", "outcome"), [
    ("eth_call", {"code": 3, "message": "execution reverted", "data": "0x"}, ExecutionReverted,
     None),
    ("eth_call", {"code": -32015, "message": "VM Exception: revert"}, ExecutionReverted, None),
    ("eth_foo", {"code": -32601, "message": "Method not found"}, MethodUnsupported, None),
    # What providers say when a plan does not include a method: a missing capability of the URL.
    ("eth_getLogs", {"code": -32000, "message": "the method eth_getLogs does not exist/is not "
                     "available"}, MethodUnsupported, None),
    ("eth_getLogs", {"code": -32600, "message": "Method eth_getLogs is not available on the "
                     "free tier"}, MethodUnsupported, None),
    ("batch", {"code": -32600, "message": "Batch requests are not supported on this plan"},
     MethodUnsupported, None),
    ("eth_call", {"code": -32000, "message": "stack limit not supported"}, RpcTransientError,
     "rpc_error"),
    # A node without the state asked for says "not available" too, but of no method.
    ("eth_call", {"code": -32000, "message": "missing trie node 0xab (path ) state 0xcd is not "
                  "available"}, RpcTransientError, "rpc_error"),
    ("eth_call", {"code": -32602, "message": "bad"}, RpcDeterministicError, None),
    ("eth_call", {"code": -32000, "message": "invalid argument 1: bad block"},
     RpcDeterministicError, None),
    ("eth_getLogs", {"code": -32005, "message": "query returned more than 10000 results"},
     LogRangeTooLarge, None),
    ("eth_getLogs", {"code": -32602, "message": "Log response size exceeded. this block range "
                     "should work: [0x1, 0x2]"}, LogRangeTooLarge, None),
    ("eth_getLogs", {"code": -32000, "message": "too big", "data": "range too large, max 10"},
     LogRangeTooLarge, None),
    # The same words from another method are no range error.
    ("eth_call", {"code": -32005, "message": "query returned more than 10000 results"},
     RpcTransientError, "rate_limited"),
    ("eth_call", {"code": 429, "message": "Too Many Requests"}, RpcTransientError,
     "rate_limited"),
    ("eth_call", {"code": -32000, "message": "daily request count exceeded the quota"},
     RpcTransientError, "rate_limited"),
    ("eth_getBlockByNumber", {"code": -32000, "message": "header not found"},
     RpcTransientError, "rpc_error"),
    ("eth_call", {"code": -32603, "message": "internal error"}, RpcTransientError, "rpc_error"),
    ("eth_call", {"message": "no code"}, RpcTransientError, "bad_response"),
    ("eth_call", "oops", RpcTransientError, "bad_response"),
])
def test_errors_are_classified(method: str, error: Any, kind: type[Exception],
                               outcome: str | None) -> None:
    classified = classify_error(method, error)
    assert type(classified) is kind
    if outcome is not None:
        assert isinstance(classified, RpcTransientError) and classified.outcome == outcome


def test_a_deterministic_error_keeps_its_code_and_data() -> None:
    error = classify_error("eth_call", {"code": 3, "message": "execution reverted: no",
                                        "data": "0x08c379a0"})
    assert isinstance(error, ExecutionReverted)
    assert (error.code, error.data) == (3, "0x08c379a0")
    assert "eth_call" in str(error) and "execution reverted: no" in str(error)


@pytest.mark.parametrize(("url", "redacted"), [
    ("https://bsc-dataseed.bnbchain.org", "https://bsc-dataseed.bnbchain.org"),
    ("https://bsc-dataseed.bnbchain.org/", "https://bsc-dataseed.bnbchain.org/"),
    ("https://user:pass@node.example:8545/rpc", "https://***@node.example:8545/rpc"),
    ("https://bnb-mainnet.g.alchemy.com/v2/AbCdEf0123456789AbCdEf0123456789",
     "https://bnb-mainnet.g.alchemy.com/v2/***"),
    ("https://x.bsc.quiknode.pro/0123456789abcdef0123456789abcdef01234567/",
     "https://x.bsc.quiknode.pro/***/"),
    ("https://rpc.ankr.com/bsc?apikey=secret#frag", "https://rpc.ankr.com/bsc?***"),
    ("http://[::1]:8545/", "http://[::1]:8545/"),
    ("http://host:notaport/", "***"),
])
def test_urls_are_redacted(url: str, redacted: str) -> None:
    assert redact_url(url) == redacted


def test_a_chain_id_mismatch_names_every_wrong_url() -> None:
    error = ChainIdMismatch(56, [("https://a/***", 97), ("https://b", 1)])
    assert str(error) == ("expected chain id 56: https://a/*** serves chain id 97; "
                          "https://b serves chain id 1")


def test_an_rpc_pool_with_no_answering_url_is_an_outage_answered_503() -> None:
    error = RpcUnavailable("chain 56: every RPC URL is cooling down", retry_after=2.0)
    assert is_outage(error)  # an actor waits it out instead of crashing
    assert (error.status, error.code) == (503, "unavailable")
    assert not is_outage(ExecutionReverted("execution reverted", code=3, data="0x"))
