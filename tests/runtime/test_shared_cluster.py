"""The Redis Cluster backend's pieces that need no cluster: its URL, its hash tags, and the
key layouts that must keep what one script or one read touches in one slot."""

from __future__ import annotations

import pytest
from coredis.connection import TCPLocation

from plugins.keys.meter_redis import key_name, user_bucket_key
from plugins.projects.live import event_log
from runtime.config import ConfigError
from runtime.shared_cluster import (
    SLOTS,
    RedisClusterSharedState,
    cluster_client,
    is_cluster_url,
    key_slot,
    partition_tags,
)
from tests.support.server import make_settings


def test_a_cluster_url_names_its_startup_nodes_and_credentials() -> None:
    url = "redis+cluster://ops:s%40cret@10.0.0.1:7000,10.0.0.2:7001/0"
    assert is_cluster_url(url) and not is_cluster_url("redis://10.0.0.1:6379/0")
    pool = cluster_client(url).connection_pool
    assert pool.startup_nodes == [TCPLocation("10.0.0.1", 7000), TCPLocation("10.0.0.2", 7001)]
    assert pool.connection_kwargs["username"] == "ops"
    assert pool.connection_kwargs["password"] == "s@cret"
    settings = make_settings({"FLOWSVC_REDIS_URL": url, "FLOWSVC_JWT_SECRET": "j" * 40,
                              "FLOWSVC_INTERNAL_TOKEN": "i" * 40})
    assert settings.redis.url == url


@pytest.mark.parametrize(("url", "problem"), [
    ("redis+cluster://", "at least one host:port"),
    ("redis+cluster://10.0.0.1", "needs host:port"),
    ("redis+cluster://10.0.0.1:7000/2", "only database 0"),
])
def test_a_malformed_cluster_url_is_refused(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        cluster_client(url)


def test_a_prefix_with_braces_is_refused_on_a_cluster() -> None:
    client = cluster_client("redis+cluster://127.0.0.1:7000")
    with pytest.raises(ConfigError, match="without { or }"):
        RedisClusterSharedState(client, "flowsvc{a}:")


def test_partition_tags_spread_over_the_slots() -> None:
    tags = partition_tags(8)
    assert len(set(tags)) == 8
    for index, tag in enumerate(tags):
        assert index * SLOTS // 8 <= key_slot(f"x:{tag}:y") < (index + 1) * SLOTS // 8


def test_what_one_script_or_one_read_touches_is_in_one_slot() -> None:
    prefix = "flowsvc:"
    meter_keys = [user_bucket_key(42)] + [key_name(42, key_id, what) for key_id in (7, 8)
                                          for what in ("win", "spend", "charge:tok")]
    assert len({key_slot(prefix + name) for name in meter_keys}) == 1
    assert key_slot(prefix + user_bucket_key(42)) != key_slot(prefix + user_bucket_key(43))
    streams = [f"project-{n}" for n in range(200)]
    for partition in range(event_log.STREAM_PARTITIONS):
        mine = [event_log.redis_stream(stream) for stream in streams
                if event_log.stream_partition(stream) == partition]
        assert mine and len({key_slot(prefix + name) for name in mine}) == 1
