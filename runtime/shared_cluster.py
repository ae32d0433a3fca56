"""Redis Cluster as the shared state: the third backend, beside memory and one Redis.

``[redis] url`` names a cluster with the scheme ``redis+cluster://`` (``rediss+cluster://``
for TLS) and one or more startup nodes, comma-separated:
``redis+cluster://user:password@10.0.0.1:6379,10.0.0.2:6379``. The client learns the rest
of the topology from them and follows it (MOVED, a replica promoted after a failover).

A cluster refuses a command or a script whose keys lie in several hash slots (CROSSSLOT),
so every key that is used together with another carries a *hash tag* (the part between the
first ``{`` and ``}``, the only part hashed): a user's meter keys carry ``{u<user id>}``,
the Redis Stream of a project's events the tag of its partition (``partition_tags``).
Plugins group their multi-key work by ``RedisAccess.slot``: one script call or one XREAD
per slot, the calls of one node multiplexed on one connection. Pub/sub is sharded
(SPUBLISH/SSUBSCRIBE): a message travels only within the shard of its channel's slot
instead of being broadcast to every node. See docs/deployment.md, "Redis Cluster".
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import cache
from typing import Any
from urllib.parse import unquote, urlsplit

import coredis
from coredis._utils import hash_slot
from coredis.connection import TCPLocation
from coredis.retry import NoRetryPolicy

from runtime.config import ConfigError
from runtime.shared import (
    RedisAccess,
    RedisSharedState,
    _PubSubMessages,
    _redis_outage_is_unavailable,
)

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")
SLOTS = 16384


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster rather than one Redis."""
    return url.startswith(CLUSTER_SCHEMES)


def cluster_client(url: str, **deadlines: Any) -> coredis.RedisCluster[str]:
    """A (not yet entered) cluster client for a ``redis+cluster://`` URL; ``deadlines`` are
    the client's connection settings (see ``redis_client``).

    :raises ConfigError: the URL has no node, a node without a port, or a database other
        than 0 (a cluster has only database 0).
    """
    parts = urlsplit(url)
    credentials, _, hosts = parts.netloc.rpartition("@")
    user, _, password = credentials.partition(":")
    nodes: list[TCPLocation] = []
    for host in filter(None, hosts.split(",")):
        name, _, port = host.rpartition(":")
        if not name or not port.isdigit():
            raise ConfigError(f"redis url: cluster node {host!r} needs host:port")
        nodes.append(TCPLocation(name.strip("[]"), int(port)))
    if not nodes:
        raise ConfigError("redis url: a cluster URL names at least one host:port")
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigError("redis url: a Redis Cluster has only database 0")
    return coredis.RedisCluster(startup_nodes=nodes, username=unquote(user) or None,
                                password=unquote(password) or None,
                                ssl=parts.scheme.startswith("rediss"), decode_responses=True,
                                # Per node, not 64 over all nodes (coredis' default: about
                                # 10 a node on 3+3): a process's long-held connections (the
                                # stream tails' blocking reads, the sharded subscriptions)
                                # filled a node's share and every other command to it (the
                                # /readyz PING among them) waited for a free one for ever.
                                max_connections=64, max_connections_per_node=True,
                                **deadlines)


def redis_client(url: str, *, connect_timeout: float = 2.0, timeout: float = 2.0
                 ) -> coredis.Redis[str] | coredis.RedisCluster[str]:
    """The (not yet entered) client of a ``[redis] url``: a cluster or one Redis.

    A frozen Redis accepts connections (its kernel does) and never answers: opening a
    connection (``connect_timeout``) and every command (``timeout``, the client's
    ``stream_timeout``) have a deadline, and so has waiting for a free connection of the
    client's pool (``pool_timeout``: coredis waits for ever by default). Nothing is retried
    by the client (coredis retries twice by default) on one Redis: a retry multiplies the
    wait for a hung Redis, and the caller answers 503 or backs off anyway.
    """
    deadlines: dict[str, Any] = {"connect_timeout": connect_timeout, "stream_timeout": timeout,
                                 "pool_timeout": timeout}
    if is_cluster_url(url):
        # The cluster client keeps its own retry policy: it is what moves a command to the
        # replica promoted after a failover (with none, the clients never found it).
        return cluster_client(url, **deadlines)
    return coredis.Redis.from_url(url, decode_responses=True, retry_policy=NoRetryPolicy(),
                                  **deadlines)


def key_slot(key: str) -> int:
    """The cluster hash slot of a full Redis key (its hash tag's, when it has one)."""
    return hash_slot(key.encode())


@cache
def partition_tags(count: int) -> tuple[str, ...]:
    """``count`` hash tags whose slots are spread evenly over the 16384 (tag ``i`` lands in
    the ``i``-th of ``count`` equal slot ranges), so partitions spread over the masters of
    a cluster whose slots are split evenly. Bare ``{0}``, ``{1}``... would land at random
    and could leave a master without any."""
    tags = []
    for index in range(count):
        low, high = index * SLOTS // count, (index + 1) * SLOTS // count
        candidate = 0
        while not low <= key_slot(f"{{p{index}.{candidate}}}") < high:
            candidate += 1
        tags.append(f"{{p{index}.{candidate}}}")
    return tuple(tags)


class RedisClusterSharedState(RedisSharedState):
    """Shared state on a Redis Cluster: ``RedisSharedState`` (every one of its commands and
    scripts touches one key) with sharded pub/sub.

    :param client: a connected cluster client (``decode_responses=True``).
    :raises ConfigError: the key prefix holds ``{`` or ``}``: it would be taken for the
        hash tag of every key, putting all of them in one slot.
    """

    def __init__(self, client: coredis.RedisCluster[str], prefix: str = "flowsvc:", *,
                 timeout: float = 2.0) -> None:
        if "{" in prefix or "}" in prefix:
            raise ConfigError("redis prefix: a Redis Cluster needs a prefix without { or }")
        super().__init__(client, prefix, timeout=timeout)  # type: ignore[arg-type]
        self._cluster = client
        self.redis = RedisAccess(client, prefix, timeout,  # type: ignore[arg-type]
                                 slot_of=key_slot)

    async def publish(self, channel: str, message: str) -> None:
        with _redis_outage_is_unavailable:
            await self._cluster.spublish(self.key(channel), message)

    @asynccontextmanager
    async def subscribe(self, channel: str) -> AsyncIterator[_PubSubMessages]:
        pubsub = self._cluster.sharded_pubsub(channels=[self.key(channel)])
        async with pubsub:
            yield _PubSubMessages(pubsub)
