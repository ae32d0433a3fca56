"""The multi-host topology of issue 20, started on loopback once for a test module.

- a Redis Cluster of 3 masters with one replica each (``private_redis_cluster``);
- one PostgreSQL schema;
- two "hosts": each a ``flowsvc serve --workers 2`` on an address of its own (127.0.0.2 and
  127.0.0.3, both loopback) with its own ``var`` directory and workspace root (no shared
  directory), in a process group of its own so that ``Host.kill`` SIGKILLs the whole host;
- HAProxy in front of the two hosts, running docs/haproxy/flowsvc.cfg unchanged
  (``/readyz`` checks, round robin, no stickiness);
- an anvil chain with the reference contracts, indexed by the chain plugin;
- the fakes the hosts call, served in a Trio run of their own on a background thread (the
  hosts are configured with their URLs once, while each test has a Trio run of its own): a
  payment gateway for billing and an OpenAI-compatible model for project runs.

The hosts run the auth, keys, chain, webhooks, projects and billing plugins with billing on
the test clock, short leases and webhook retries fast.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.support.backends import postgres_schema, redis_prefix
from tests.support.background import Background, in_background
from tests.support.billing import TREASURY, USDT_TOKEN
from tests.support.chain.indexing import deployed_anvil
from tests.support.chain.service import chain_entry, chains_env
from tests.support.fake_gateway import FakeGateway
from tests.support.fake_openai import FakeOpenAI
from tests.support.fake_provider import running_fake
from tests.support.haproxy import haproxy
from tests.support.private_servers import PrivateRedisCluster, private_redis_cluster
from tests.support.processes import READY_TIMEOUT_SECONDS, run_flowsvc
from tests.support.server import ROOT, free_port, settings_env, tls_context

HOST_ADDRESSES = ("127.0.0.2", "127.0.0.3")
WORKERS_PER_HOST = 2
CHAIN_ID = 31337
LEASE_SECONDS = 2  # projects' run lease and the chain indexer's: a dead host is seen soon
PLUGINS = ["auth", "keys", "chain", "webhooks", "projects", "billing"]
PRICING = {"GET /me": "0.4"}  # what the spend cap test pays per request

@dataclass
class Fakes:
    """The providers the hosts call, served by the background run."""

    background: Background
    gateway: FakeGateway
    model: FakeOpenAI
    model_url: str


@asynccontextmanager
async def _serving_fakes(background: Background) -> AsyncIterator[Fakes]:
    model = FakeOpenAI([])
    async with running_fake(FakeGateway()) as gateway, trio.open_nursery() as nursery:
        model_url = await nursery.start(model.serve)
        yield Fakes(background, gateway, model, model_url)
        nursery.cancel_scope.cancel()


class Host:
    """One host: ``flowsvc serve --workers 2`` on its own address, port, var directory and
    workspace root; the parent and its workers are one process group."""

    def __init__(self, name: str, address: str, folder: Path, env: dict[str, str]) -> None:
        self.name = name
        self.port = free_port()
        self.address = f"{address}:{self.port}"
        self.url = f"http://{self.address}"
        self.log_path = folder / f"{name}.log"
        folder.mkdir(parents=True, exist_ok=True)
        self.env = {**env, "FLOWSVC_SERVICE_VAR_DIR": str(folder / "var"),
                    "FLOWSVC_PLUGINS_PROJECTS_WORKSPACE_ROOT": str(folder / "workspaces")}
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "runtime.cli", "--config", os.devnull, "serve",
                 "--workers", str(WORKERS_PER_HOST), "--bind", self.address],
                cwd=ROOT, env={**os.environ, **self.env}, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def kill(self) -> None:
        """SIGKILL the host: its parent and every worker at once (no drain, no flush)."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self) -> None:
        """SIGTERM the group (the workers drain), SIGKILL what is left after 20 s."""
        if self.process is None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
            self.process.wait(timeout=20)
        except ProcessLookupError:
            return  # killed by the test
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")


def readiness(url: str) -> dict[str, Any]:
    """``GET /readyz`` on a new connection (so that any worker of a host may answer)."""
    answer = httpx.get(f"{url}/readyz", timeout=10, headers={"connection": "close"},
                       verify=tls_context())
    assert answer.status_code == 200, answer.text
    body: dict[str, Any] = answer.json()
    return body


def process_of(ready: dict[str, Any]) -> str:
    """The name of the process that answered ``/readyz`` (its chain lease owner)."""
    name: str = ready["checks"]["chain_indexers"]["process"]
    return name


def wait_all_workers(host: Host, timeout: float = READY_TIMEOUT_SECONDS) -> set[str]:
    """Until ``/readyz`` on ``host`` was answered by each of its workers; their names."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while len(seen) < WORKERS_PER_HOST:
        if not host.running():
            raise RuntimeError(f"{host.name} exited:\n{host.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{host.name}: {len(seen)} workers ready in {timeout} s "
                               f"({last!r}):\n{host.output()[-3000:]}")
        try:
            seen.add(process_of(readiness(host.url)))
        except (httpx.HTTPError, AssertionError) as exc:
            last = exc
            time.sleep(0.1)
    return seen


@dataclass
class Topology:
    """What ``running_topology`` started: ``url`` is HAProxy's."""

    url: str
    hosts: list[Host]
    cluster: PrivateRedisCluster
    fakes: Fakes
    database_url: str
    haproxy_log: Path

    def assert_hosts_running(self) -> None:
        assert [host.name for host in self.hosts if not host.running()] == []

    def wait_balanced(self, timeout: float = 60.0) -> None:
        """Until HAProxy sends requests to both hosts again (after its checks took them out:
        two good checks, about 4 s, bring a server back)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            served = set()
            for _ in range(4):
                answer = httpx.get(f"{self.url}/healthz", timeout=10,
                                   verify=tls_context())
                served.add(answer.headers.get("x-served-by"))
            if served == {"flowsvc-1", "flowsvc-2"}:
                return
            time.sleep(0.5)
        raise AssertionError(f"HAProxy did not balance over both hosts in {timeout} s:\n"
                             f"{self.haproxy_log.read_text()[-3000:]}")


def topology_env(folder: Path, database_url: str, cluster: PrivateRedisCluster, fakes: Fakes,
                 chain: dict[str, Any]) -> dict[str, str]:
    """The settings both hosts share (each adds its var directory and workspace root)."""
    settings = {
        "PLUGINS_PROJECTS": {"BACKEND": "openai", "MODEL_BASE_URL": fakes.model_url,
                             "MODEL": "fake-model", "MODEL_API_KEY": "sk-fake",
                             "LEASE_SECONDS": str(LEASE_SECONDS), "HEARTBEAT_SECONDS": "1"},
        "PLUGINS_WEBHOOKS": {"ALLOW_HTTP": "true", "ALLOWED_HOSTS": '["127.0.0.1"]',
                             "BACKOFF_BASE_SECONDS": "0.05", "TIMEOUT_SECONDS": "2",
                             "POLL_SECONDS": "0.2"},
        "PLUGINS_BILLING": {"TEST_CLOCK": "true", "USDT_TOKEN": USDT_TOKEN,
                            "USDT_TREASURY": TREASURY,
                            "GATEWAY_BASE_URL": fakes.gateway.base_url,
                            "GATEWAY_SECRET_KEY": fakes.gateway.secret_key,
                            "GATEWAY_WEBHOOK_SECRET": fakes.gateway.webhook_secret},
        "PLUGINS_CHAIN": {"LEASE_SECONDS": str(LEASE_SECONDS)},
        "LIMITS": {"ANONYMOUS_RPM": "0", "AUTHENTICATED_RPM": "0", "INTERNAL_RPM": "0"},
        "SERVICE": {"ENVIRONMENT": "test", "LOG_LEVEL": "warning"},
    }
    extra = {f"FLOWSVC_{section}_{key}": value
             for section, values in settings.items() for key, value in values.items()}
    extra.update({"FLOWSVC_PRICING": json.dumps(PRICING), **chains_env([chain])})
    return settings_env(folder / "var", database_url=database_url, redis_url=cluster.url,
                        redis_prefix=redis_prefix(), plugins=PLUGINS, extra=extra)


@contextmanager
def running_topology(folder: Path) -> Iterator[Topology]:
    """Start the whole topology (about a minute on a loaded two-core machine); stop it at
    the end, printing the hosts' and HAProxy's output when the block failed."""
    with private_redis_cluster() as cluster, postgres_schema() as database_url, \
            deployed_anvil(CHAIN_ID) as (anvil, deployment), \
            in_background(_serving_fakes) as fakes:
        chain = chain_entry(deployment.platform, [anvil.url],
                            instance=deployment.dpnm.instance)
        env = topology_env(folder, database_url, cluster, fakes, chain)
        code, output = run_flowsvc(env, "migrate", timeout=180)
        assert code == 0, output
        hosts = [Host(f"host{index}", address, folder / f"host{index}", env)
                 for index, address in enumerate(HOST_ADDRESSES, start=1)]
        haproxy_log = folder / "haproxy.log"
        failed = False
        try:
            for host in hosts:  # both start at once (the schema is migrated already)
                host.start()
            for host in hosts:
                wait_all_workers(host)
            front = free_port()
            with haproxy(front, [host.address for host in hosts], haproxy_log):
                yield Topology(f"http://127.0.0.1:{front}", hosts, cluster, fakes,
                               database_url, haproxy_log)
        except BaseException:
            failed = True
            raise
        finally:
            for host in hosts:
                host.stop()
            if failed:
                for host in hosts:
                    print(f"--- {host.name}\n{host.output()[-5000:]}")
