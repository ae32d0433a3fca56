"""Service processes on a Redis Cluster (3 masters, one replica each, on loopback): one cap
per key and one spend per period across processes, run events across processes, and a
master killed under load and during a run.

The cluster and four ``flowsvc serve`` processes (auth and keys) are shared by the tests of
this module: starting them is most of the cost.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from plugins.projects.live import event_log
from tests.support.backends import preferred_database, redis_prefix
from tests.support.fake_openai import FakeOpenAI, StreamedTurn
from tests.support.keys import create_key, keys_env
from tests.support.private_servers import PrivateRedisCluster, private_redis_cluster
from tests.support.processes import serving
from tests.support.projects import assert_well_formed, projects_env, service_process
from tests.support.server import free_port
from tests.support.sse import open_sse
from tests.support.tokens import add_token
from tests.support.wallet import sign_in


@pytest.fixture(scope="module")
def cluster() -> Iterator[PrivateRedisCluster]:
    with private_redis_cluster() as running:
        yield running


class Fleet:
    """The module's service processes and their base URLs."""

    def __init__(self, processes: list[subprocess.Popen[bytes]], ports: list[int]) -> None:
        self.processes = processes
        self.urls = [f"http://127.0.0.1:{port}" for port in ports]

    def assert_all_running(self) -> None:
        assert [process.poll() for process in self.processes] == [None] * len(self.processes)


@pytest.fixture(scope="module")
def fleet(cluster: PrivateRedisCluster, tmp_path_factory: pytest.TempPathFactory
          ) -> Iterator[Fleet]:
    folder = tmp_path_factory.mktemp("fleet")
    ports = [free_port() for _ in range(4)]
    with preferred_database(folder) as database_url:
        # One process migrates the database first; the others start on it together.
        env = keys_env(folder / "var", database_url, cluster.url, prefix=redis_prefix(),
                       pricing={"GET /me": "0.4"},
                       extra={"FLOWSVC_SERVICE_LOG_LEVEL": "warning",
                              "FLOWSVC_LIMITS_AUTHENTICATED_RPM": "0"})
        with serving(env, ports[:1]) as first, \
                serving({**env, "FLOWSVC_DATABASE_MIGRATE_ON_START": "false"},
                        ports[1:]) as others:
            yield Fleet(first + others, ports)


async def _statuses(urls: list[str], raw_key: str, path: str, count: int) -> list[int]:
    """``count`` concurrent requests with the key, spread over ``urls``."""
    statuses: list[int] = []
    limits = httpx.Limits(max_connections=count)
    async with httpx.AsyncClient(headers={"x-api-key": raw_key}, limits=limits,
                                 timeout=60) as caller:
        async def one(n: int) -> None:
            statuses.append((await caller.get(urls[n % len(urls)] + path)).status_code)

        async with trio.open_nursery() as nursery:
            for n in range(count):
                nursery.start_soon(one, n)
    return statuses


async def _user_key(url: str, **fields: Any) -> dict[str, Any]:
    """A new user's key, with ``user_id``."""
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        _, user = await sign_in(http)
        return {**await create_key(http, **fields), "user_id": user["id"]}


async def test_a_key_cap_is_exact_across_four_processes(fleet: Fleet) -> None:
    # Two owners at once: their meter keys are in two slots, so batches are cut per slot.
    first = await _user_key(fleet.urls[0], rate_limit_rpm=50)
    second = await _user_key(fleet.urls[1], rate_limit_rpm=20)
    results: dict[str, list[int]] = {}

    async def load(name: str, key: dict[str, Any], count: int) -> None:
        results[name] = await _statuses(fleet.urls, key["raw_key"], "/healthz", count)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(load, "first", first, 200)
        nursery.start_soon(load, "second", second, 80)
    assert (results["first"].count(200), results["first"].count(429)) == (50, 150)
    assert (results["second"].count(200), results["second"].count(429)) == (20, 60)
    fleet.assert_all_running()


async def test_spend_cap_overruns_by_less_than_one_request(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.urls[2], timeout=30) as http:
        await sign_in(http)
        key = await create_key(http, spend_limit_flow="1")
        statuses = await _statuses(fleet.urls, key["raw_key"], "/me", 40)
        # 0.4 a request: the third crosses the cap of 1 and is served, none after it.
        assert (statuses.count(200), statuses.count(402)) == (3, 37)
        [listed] = (await http.get("/me/api-keys")).json()["keys"]
        assert listed["spend_period_used"] == "1.200000"


async def test_a_master_killed_under_load_is_waited_out(
        fleet: Fleet, cluster: PrivateRedisCluster) -> None:
    key = await _user_key(fleet.urls[0], rate_limit_rpm=0)
    refusals: list[httpx.Response] = []
    served = 0
    healed = trio.Event()

    async def load() -> None:
        nonlocal served
        async with httpx.AsyncClient(headers={"x-api-key": key["raw_key"]},
                                     timeout=60) as caller:
            n = 0
            while not healed.is_set():
                response = await caller.get(fleet.urls[n % 4] + "/healthz")
                n += 1
                if response.status_code == 200:
                    served += 1
                else:
                    refusals.append(response)

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(load)
        await trio.sleep(1)
        # The master of the key owner's slot (its meter keys and bucket).
        killed = cluster.kill_master(f"{{u{key['user_id']}}}")
        await trio.to_thread.run_sync(cluster.wait_healthy, 60)
        # Until the processes' clients have found the promoted replica: a clean answer.
        with trio.fail_after(60):
            while True:
                statuses = await _statuses(fleet.urls, key["raw_key"], "/healthz", 40)
                if statuses == [200] * 40:
                    break
                await trio.sleep(0.5)
        healed.set()
    assert served > 0 and refusals
    for response in refusals:
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "unavailable"
    fleet.assert_all_running()
    # Caps are exact after the failover (two owners: batches cut per slot, sent to the
    # promoted replica too, which must be given the script), and the killed node comes back
    # as a replica.
    keys = [await _user_key(fleet.urls[3], rate_limit_rpm=cap) for cap in (30, 20)]
    results: list[list[int]] = []

    async def load_capped(raw: str) -> None:
        results.append(await _statuses(fleet.urls, raw, "/healthz", 90))

    async with trio.open_nursery() as nursery:
        for capped in keys:
            nursery.start_soon(load_capped, capped["raw_key"])
    assert sorted(statuses.count(200) for statuses in results) == [20, 30]
    await trio.to_thread.run_sync(cluster.restart, killed)
    fleet.assert_all_running()


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
