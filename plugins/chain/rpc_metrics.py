"""What the RPC pool reports about each request: a small observer interface and its
Prometheus implementation.

The service owns one ``CollectorRegistry`` per instance, so collectors are created from the
registry passed in (once per registry: two chains share them and differ by the ``chain``
label), never on the global registry.
"""

from __future__ import annotations

from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class RpcObserver(Protocol):
    """Receives one call per HTTP request a pool makes (a batch is one request), and each
    change of what a URL serves."""

    def observe(self, url: str, method: str, outcome: str, seconds: float) -> None:
        """Record a request to the redacted ``url`` for ``method`` (``batch`` for a batch) that
        ended with ``outcome`` (``ok`` or an error label) after ``seconds``."""

    def unsupported(self, url: str, method: str, marked: bool) -> None:
        """Record that the redacted ``url`` is now ``marked`` as not serving ``method`` (or
        that the mark expired)."""


class NullObserver:
    """Records nothing: the observer of a pool built without metrics."""

    def observe(self, url: str, method: str, outcome: str, seconds: float) -> None:
        """Ignore the request."""

    def unsupported(self, url: str, method: str, marked: bool) -> None:
        """Ignore the mark."""


class RpcMetrics:
    """The Prometheus collectors of chain RPC traffic, registered on ``registry``.

    Raises ``ValueError`` (from prometheus_client) if they are already registered there:
    create one ``RpcMetrics`` per registry and call ``for_chain`` for each chain.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter(
            "flowsvc_chain_rpc_requests", "Chain JSON-RPC requests by chain, URL (redacted), "
            "method and outcome (ok, or the error's label)",
            ["chain", "url", "method", "outcome"], registry=registry)
        self.seconds = Histogram(
            "flowsvc_chain_rpc_seconds", "Chain JSON-RPC request latency by chain, URL and method",
            ["chain", "url", "method"], registry=registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.unsupported = Gauge(
            "flowsvc_chain_rpc_unsupported", "1 while a chain's RPC URL (redacted) is not asked "
            "for a method it answered it does not serve (the other URLs serve it)",
            ["chain", "url", "method"], registry=registry)

    def for_chain(self, chain: str) -> RpcObserver:
        """Return the observer a pool of ``chain`` reports to."""
        return _ChainObserver(self, chain)


class _ChainObserver:
    """Keeps each label set's children: ``labels()`` takes a lock and builds its key on
    every call, a visible part of an on-chain read's CPU."""

    def __init__(self, metrics: RpcMetrics, chain: str) -> None:
        self.metrics = metrics
        self.chain = chain
        self._requests: dict[tuple[str, str, str], Counter] = {}
        self._seconds: dict[tuple[str, str], Histogram] = {}

    def observe(self, url: str, method: str, outcome: str, seconds: float) -> None:
        requests = self._requests.get((url, method, outcome))
        if requests is None:
            requests = self._requests[url, method, outcome] = self.metrics.requests.labels(
                self.chain, url, method, outcome)
        requests.inc()
        latency = self._seconds.get((url, method))
        if latency is None:
            latency = self._seconds[url, method] = self.metrics.seconds.labels(
                self.chain, url, method)
        latency.observe(seconds)

    def unsupported(self, url: str, method: str, marked: bool) -> None:
        self.metrics.unsupported.labels(self.chain, url, method).set(1 if marked else 0)
