"""The errors of talking JSON-RPC to a chain, how an answer is classified, and URL redaction.

Classification decides what the pool does: a deterministic error (a revert, bad parameters)
would fail the same way on every node, so it is raised at once and the node stays healthy; a
method the URL does not serve (``MethodUnsupported``: many free tiers refuse ``eth_getLogs``)
is that URL's missing capability, so the method goes to the other URLs; a transient one
(timeout, 429, 5xx, a node-side fault) cools the URL down and the request moves to the next URL;
an ``eth_getLogs`` range error is neither: the node is healthy, the caller must ask for a
smaller range (see ``logrange``).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from plugins.chain.rangehints import RangeHint, parse_range_hint
from runtime.errors import Unavailable

# JSON-RPC and EIP-1474 codes that mean "this request is wrong", whichever node answers it.
_DETERMINISTIC_CODES = frozenset({3, -32602})
_DETERMINISTIC_TEXT = ("invalid argument", "invalid params")
# -32601 is "method not found"; other codes (-32600, -32000...) say the same in words: geth's
# "the method eth_x does not exist/is not available", "method not supported/allowed/enabled".
_UNSUPPORTED_CODE = -32601
_UNSUPPORTED_TEXT = re.compile(
    r"\bmethod\b.*\b(not (found|supported|available|allowed|enabled|whitelisted)"
    r"|does not exist|unsupported|disabled)|\bunsupported method")
# What a URL refusing batches says of them ("batch requests are not supported").
_BATCH_REFUSED_TEXT = re.compile(r"\bnot (supported|allowed|enabled)\b|unsupported|disabled")
_RATE_LIMIT_TEXT = ("rate limit", "too many requests", "limit exceeded", "exceeded the quota")
_RATE_LIMIT_CODES = frozenset({429, -32005})
# A path segment this long made of key-like characters is treated as an API key (Alchemy,
# Infura, QuickNode and others put the key in the path).
_SECRET_SEGMENT = re.compile(r"^[A-Za-z0-9_\-]{16,}$")


class RpcError(Exception):
    """Base of every chain RPC error."""


class RpcDeterministicError(RpcError):
    """The node answered that this request itself is wrong (method not found, invalid params or
    argument); raised at once, never retried, and the URL is not cooled down.

    :param code: the JSON-RPC error code.
    :param data: the error's ``data`` member, as sent.
    """

    def __init__(self, message: str, *, code: int, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.data = data


class MethodUnsupported(RpcDeterministicError):
    """A URL does not serve ``method`` (JSON-RPC -32601, a message saying the method does not
    exist / is not available / is not supported, or HTTP 403 or 405). The URL's own answer
    (from ``RpcEndpoint``) marks the method unsupported on that URL for a long time and the
    pool asks the other URLs; the pool raises it when no URL of the chain serves the method,
    which is the failure of that chain (its supervisor takes it down and retries it later),
    never of the process.

    :param method: the method not served.
    """

    def __init__(self, message: str, *, method: str, code: int = _UNSUPPORTED_CODE,
                 data: Any = None) -> None:
        super().__init__(message, code=code, data=data)
        self.method = method


class ExecutionReverted(RpcDeterministicError):
    """The call reverted; ``data`` holds the revert data (hex) when the node sent it."""


class LogRangeTooLarge(RpcError):
    """An ``eth_getLogs`` answer of "range too large / too many results"; the caller asks for a
    smaller range. The URL is healthy and is not cooled down.

    :param hint: what the provider said about a range that would work.
    :param url: the redacted label of the URL that answered (set by the endpoint).
    """

    def __init__(self, message: str, *, hint: RangeHint, url: str = "") -> None:
        super().__init__(message)
        self.hint = hint
        self.url = url


class RpcTransientError(RpcError):
    """One URL failed in a way another URL may not: timeout, HTTP 429 or 5xx, a transport
    error, a malformed answer, a node-side fault, or a node behind the final head. Raised by
    ``RpcEndpoint``; the pool cools the URL down and tries the next one, so callers of
    ``RpcPool`` never see it.

    :param outcome: a short label for metrics (``timeout``, ``rate_limited``, ``http_error``...).
    :param retry_after: seconds the server asked us to wait (``Retry-After``), if it said.
    """

    def __init__(self, message: str, *, outcome: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.outcome = outcome
        self.retry_after = retry_after


class RpcUnavailable(RpcError, Unavailable):
    """No URL of the pool could answer: every URL is cooling down, or each one tried failed
    transiently, or the deadline passed. An ``Unavailable``: a route answers it as 503
    ``unavailable``, and an actor waits it out as an outage (``runtime.errors.is_outage``).

    :param retry_after: seconds until the first URL leaves its cooldown, when that is known.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ChainIdMismatch(RpcError):
    """A URL serves another chain than the configured one.

    :param expected: the configured chain id.
    :param mismatches: (redacted URL, chain id it serves) for each URL that is wrong.
    """

    def __init__(self, expected: int, mismatches: list[tuple[str, int]]) -> None:
        wrong = "; ".join(f"{url} serves chain id {actual}" for url, actual in mismatches)
        super().__init__(f"expected chain id {expected}: {wrong}")
        self.expected = expected
        self.mismatches = mismatches


def classify_error(method: str, error: object) -> RpcError:
    """Turn the ``error`` member of a JSON-RPC answer to ``method`` into the error to raise.

    Range errors are recognised only for ``eth_getLogs`` (the same words from another method
    mean something else). Returns, never raises.
    """
    if not isinstance(error, dict) or not isinstance(error.get("code"), int):
        return RpcTransientError(f"malformed JSON-RPC error: {str(error)[:200]}",
                                 outcome="bad_response")
    code: int = error["code"]
    message = str(error.get("message", ""))
    data = error.get("data")
    text = f"{method}: {message} (code {code})"
    lowered = message.lower()
    if method == "eth_getLogs":
        hint = parse_range_hint(f"{message} {data if isinstance(data, str) else ''}")
        if hint is not None:
            return LogRangeTooLarge(text, hint=hint)
    if code == 3 or "revert" in lowered:
        return ExecutionReverted(text, code=code, data=data)
    if code == _UNSUPPORTED_CODE or _UNSUPPORTED_TEXT.search(lowered) or (
            method == "batch" and _BATCH_REFUSED_TEXT.search(lowered)):
        return MethodUnsupported(text, method=method, code=code, data=data)
    if code in _DETERMINISTIC_CODES or any(words in lowered for words in _DETERMINISTIC_TEXT):
        return RpcDeterministicError(text, code=code, data=data)
    if code in _RATE_LIMIT_CODES or any(words in lowered for words in _RATE_LIMIT_TEXT):
        return RpcTransientError(text, outcome="rate_limited")
    return RpcTransientError(text, outcome="rpc_error")


def redact_url(url: str) -> str:
    """Return ``url`` fit for logs, metrics and error messages: user info, query, fragment and
    key-like path segments are replaced by ``***``. Raises nothing (an unparsable URL is
    replaced whole)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "***"
    netloc = ("***@" if parts.username or parts.password else "") + (
        f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    path = "/".join("***" if _SECRET_SEGMENT.match(segment) else segment
                    for segment in parts.path.split("/"))
    return urlunsplit((parts.scheme, netloc, path, "***" if parts.query else "", ""))
