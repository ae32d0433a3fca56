"""The indexer's Prometheus collectors, on the service's registry (one set per service; the
chains differ by their ``chain`` label). RPC errors and latency per URL are
``rpc_metrics``'s."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class IndexerMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.head_lag = Gauge(
            "flowsvc_chain_head_lag_blocks", "Blocks between the node's head and the newest "
            "indexed block, per chain", ["chain"], registry=registry)
        self.indexed_block = Gauge(
            "flowsvc_chain_indexed_block", "The newest indexed block, per chain", ["chain"],
            registry=registry)
        self.reorgs = Counter(
            "flowsvc_chain_reorgs", "Reorgs the indexer rolled back, per chain", ["chain"],
            registry=registry)
        self.reorg_depth = Histogram(
            "flowsvc_chain_reorg_depth_blocks", "Blocks dropped by each reorg, per chain",
            ["chain"], registry=registry, buckets=(1, 2, 3, 5, 8, 13, 21, 34, 64))
        self.stalls = Counter(
            "flowsvc_chain_stalls", "Times a URL's head stopped advancing for longer than "
            "stall_timeout_seconds (the indexer failed over when it could), per chain",
            ["chain"], registry=registry)
        self.unreadable = Gauge(
            "flowsvc_chain_unreadable_tokens", "Registered tokens the indexer could not read "
            "(not a dpnm instance), per chain", ["chain"], registry=registry)
        self.logs = Counter(
            "flowsvc_chain_indexed_logs", "Logs of followed contracts indexed, per chain",
            ["chain"], registry=registry)
