"""Prometheus metrics of one service instance, served at ``GET /metrics``.

Each service owns its own ``CollectorRegistry`` (no process-global state), so tests can
run several services in one process. Plugins add their own collectors to
``metrics.registry``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

CONTENT_TYPE = CONTENT_TYPE_LATEST
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5)


class RequestStats:
    """HTTP requests by route, method and status, and their latency by route.

    Counted in plain dictionaries and turned into Prometheus families when scraped: every
    request counts here, and ``Counter.inc`` plus ``Histogram.observe`` cost it two label
    lookups and two locks (``docs/performance.md``). Everything runs on the Trio thread,
    scrapes included, so nothing needs a lock.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self._counts: defaultdict[tuple[str, str, str], int] = defaultdict(int)
        self._buckets: dict[str, list[int]] = {}
        self._sums: defaultdict[str, float] = defaultdict(float)
        registry.register(self)

    def observe(self, route: str, method: str, status: str, seconds: float) -> None:
        """Count one request and its latency."""
        self._counts[(route, method, status)] += 1
        buckets = self._buckets.get(route)
        if buckets is None:
            buckets = self._buckets[route] = [0] * (len(LATENCY_BUCKETS) + 1)
        buckets[bisect_left(LATENCY_BUCKETS, seconds)] += 1
        self._sums[route] += seconds

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily("flowsvc_http_requests",
                                       "HTTP requests by route template, method and status",
                                       labels=["route", "method", "status"])
        for labels, count in self._counts.items():
            requests.add_metric(list(labels), count)
        yield requests
        latency = HistogramMetricFamily("flowsvc_http_request_seconds",
                                        "HTTP request latency by route template",
                                        labels=["route"])
        for route, buckets in self._buckets.items():
            cumulative, total = [], 0
            for bound, count in zip((*map(str, LATENCY_BUCKETS), "+Inf"), buckets,
                                    strict=True):
                total += count
                cumulative.append((bound, total))
            latency.add_metric([route], cumulative, self._sums[route])
        yield latency


class Metrics:
    """The core collectors: HTTP traffic and connections, actor restarts, mailbox depths and
    failed parts."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = RequestStats(self.registry)
        self.actor_restarts = Counter(
            "flowsvc_actor_restarts", "Restarts of each actor by the supervisor",
            ["actor"], registry=self.registry)
        self.mailbox_depth = Gauge(
            "flowsvc_actor_mailbox_depth", "Messages waiting in each actor's mailbox",
            ["actor"], registry=self.registry)
        self.part_failed = Gauge(
            "flowsvc_part_failed", "1 while a part of the service (a plugin, one chain) is down "
            "after exhausting its restart intensity, until it starts again",
            ["part"], registry=self.registry)
        self.part_failures = Counter(
            "flowsvc_part_failures", "Times each part of the service went down",
            ["part"], registry=self.registry)
        self.open_connections = Gauge(
            "flowsvc_http_connections", "Open client connections", registry=self.registry)
        self.refused_connections = Counter(
            "flowsvc_http_connections_refused",
            "Connections refused at service.max_connections", registry=self.registry)

    def render(self) -> bytes:
        """The Prometheus text exposition of every collector."""
        return generate_latest(self.registry)
