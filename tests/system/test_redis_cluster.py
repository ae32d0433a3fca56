"""Service processes on a Redis Cluster (3 masters, one replica each, on loopback): run
events across processes while the master of a stream's slot is killed.

The caps, the spend cap and a master killed under load are tested on the two-host topology
(tests/system/test_hosts.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from plugins.projects.live import event_log
from tests.support.backends import preferred_database, redis_prefix
from tests.support.fake_openai import FakeOpenAI, StreamedTurn
from tests.support.private_servers import PrivateRedisCluster, private_redis_cluster
from tests.support.projects import assert_well_formed, projects_env, service_process
from tests.support.server import free_port
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateRedisCluster]:
    with private_redis_cluster() as running:
        yield running


async def test_a_reader_on_another_process_gets_every_event_once_in_order(
        cluster: PrivateRedisCluster, tmp_path: Path, nursery: trio.Nursery) -> None:
    model = FakeOpenAI([StreamedTurn("Plan:\n1. Look\n2. Report", [("list_files", "{}")] * 5),
                        StreamedTurn("All done.")] * 2)
    model_url = await nursery.start(model.serve)
    with preferred_database(tmp_path) as database_url:
        env = projects_env(tmp_path / "var", database_url=database_url, redis_url=cluster.url,
                           prefix=redis_prefix(), backend="openai", model_base_url=model_url,
                           model="fake", heartbeat_seconds="1")
        port_a, port_b = free_port(), free_port()
        async with service_process(env, port_a, tmp_path / "a.log") as process_a, \
                service_process({**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"}, port_b,
                                tmp_path / "b.log") as process_b:
            url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
            async with httpx.AsyncClient(base_url=url_a, timeout=30) as on_a:
                wallet, _ = await sign_in(on_a)
                slugs, ids = [], []
                for token in ("twin", "twain"):  # two projects: two streams
                    added = await add_token(url_a, token, wallet.address.lower())
                    assert added.status_code == 201
                    created = await on_a.post("/projects", json={
                        "tokenSlug": token, "title": token.title(),
                        "agentTemplate": "research-agent", "brief": "Compare the processes."})
                    assert created.status_code == 201, created.text
                    slugs.append(created.json()["slug"])
                    ids.append(created.json()["id"])
                seen: dict[str, list[Any]] = {}
                for slug, project_id in zip(slugs, ids, strict=True):  # the model answers in turn
                    async with open_sse(url_b, f"/projects/{slug}/stream") as on_b:
                        if slug == slugs[1]:
                            # The master of the second stream's slot dies as its run starts:
                            # its events reach B all the same (from the database meanwhile).
                            stream = f"project-{project_id}"
                            killed = await trio.to_thread.run_sync(
                                cluster.kill_master,
                                event_log.partition_tag(event_log.stream_partition(stream)))
                        assert (await on_a.post(f"/projects/{slug}/start")).status_code == 201
                        seen[slug] = await on_b.until("done", timeout=60)
                await trio.to_thread.run_sync(cluster.wait_healthy, 60)
                await trio.to_thread.run_sync(cluster.restart, killed)
                assert process_a.returncode is None and process_b.returncode is None
                for slug in slugs:
                    assert_well_formed(seen[slug])
                    assert [int(event.id) for event in seen[slug]] == list(range(1, 15))
                # Resume on process B after event 9, after the failover: the rest, once, in order.
                async with open_sse(url_b, f"/projects/{slugs[1]}/stream",
                                    {"Last-Event-ID": "9"}) as resumed:
                    rest = await resumed.until("done")
                assert [event.id for event in rest] == [event.id for event in seen[slugs[1]][9:]]
