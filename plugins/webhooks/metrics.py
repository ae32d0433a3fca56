"""The webhook dispatcher's Prometheus collectors, on the service's registry."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class DispatcherMetrics:
    """Attempts by outcome, their durations and the attempts in flight, per process.

    Made once per service (``WebhooksState``): a registry refuses a second collector of
    the same name.
    """

    def __init__(self, registry: CollectorRegistry) -> None:
        self.attempts = Counter(
            "flowsvc_webhook_attempts", "Webhook delivery attempts by how they settled "
            "(delivered, retry, failed, stale)", ["outcome"], registry=registry)
        self.seconds = Histogram(
            "flowsvc_webhook_attempt_seconds", "Duration of webhook delivery attempts",
            registry=registry, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
        self.in_flight = Gauge("flowsvc_webhook_in_flight", "Webhook attempts being sent",
                               registry=registry)
