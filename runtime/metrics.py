"""Prometheus metrics of one service instance, served at ``GET /metrics``.

Each service owns its own ``CollectorRegistry`` (no process-global state), so tests can
run several services in one process. Plugins add their own collectors to
``metrics.registry``.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST


class Metrics:
    """The core collectors: HTTP traffic, actor restarts and mailbox depths."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "flowsvc_http_requests", "HTTP requests by route template, method and status",
            ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram(
            "flowsvc_http_request_seconds", "HTTP request latency by route template",
            ["route"], registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5))
        self.actor_restarts = Counter(
            "flowsvc_actor_restarts", "Restarts of each actor by the supervisor",
            ["actor"], registry=self.registry)
        self.mailbox_depth = Gauge(
            "flowsvc_actor_mailbox_depth", "Messages waiting in each actor's mailbox",
            ["actor"], registry=self.registry)

    def render(self) -> bytes:
        """The Prometheus text exposition of every collector."""
        return generate_latest(self.registry)
