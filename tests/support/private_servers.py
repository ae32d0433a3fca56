"""PostgreSQL and Redis servers of a test's own, to stop and start while a service runs.

Outage tests must never stop the shared servers other tests use: these are private, on
free loopback ports, their data in a temporary folder, gone with the test. PostgreSQL
refuses to run as root, so when the tests run as root its commands run as the
``postgres`` system user (the Debian package creates it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support.server import claim_port, free_port

PG_BIN = Path(sorted(Path("/usr/lib/postgresql").glob("*/bin"))[-1]) \
    if Path("/usr/lib/postgresql").exists() else Path("/usr/bin")


def _as_postgres(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


class PrivatePostgres:
    """A PostgreSQL cluster of one test: ``start``, ``stop`` (fast), ``start`` again."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        if os.geteuid() == 0:
            shutil.chown(folder, "postgres")
        subprocess.run(_as_postgres([str(PG_BIN / "initdb"), "-D", str(folder / "data"),
                                     "-A", "trust", "-U", "postgres", "--no-sync",
                                     "-E", "UTF8"]),
                       check=True, capture_output=True)

    def start(self) -> None:
        options = (f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 "
                   "-c fsync=off -c max_connections=200")
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.folder / "data"),
                                     "-o", options, "-l", str(self.folder / "log"), "-w",
                                     "start"]), check=True, capture_output=True)

    def processes(self) -> list[int]:
        """The postmaster and every process it started (backends, background workers)."""
        postmaster = int((self.folder / "data" / "postmaster.pid").read_text().split()[0])
        return [postmaster, *_children(postmaster)]

    def stop(self) -> None:
        """Stop at once (``-m fast``: open connections are cut, as in a failover)."""
        subprocess.run(_as_postgres([str(PG_BIN / "pg_ctl"), "-D", str(self.folder / "data"),
                                     "-m", "fast", "-w", "stop"]),
                       check=True, capture_output=True)


class PrivateRedis:
    """A Redis of one test, keeping nothing on disk like the shared one: a restart empties it."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        assert self._process is None, "this Redis runs already"
        self._process = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.folder)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            probe = subprocess.run(["redis-cli", "-p", str(self.port), "ping"],
                                   capture_output=True, text=True)
            if probe.stdout.strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    def processes(self) -> list[int]:
        """The server's process."""
        assert self._process is not None
        return [self._process.pid]

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            self._process = None

    def pause(self) -> None:
        """SIGSTOP: Redis hangs, connections open, nothing answered (a stall, not a stop)."""
        assert self._process is not None
        self._process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: Redis runs what it was sent meanwhile and answers."""
        assert self._process is not None
        self._process.send_signal(signal.SIGCONT)


def _children(parent: int) -> list[int]:
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue  # the process ended meanwhile
        if int(fields[1]) == parent:
            children.append(int(stat.parent.name))
    return children


@contextmanager
def frozen(server: PrivatePostgres | PrivateRedis) -> Iterator[None]:
    """``server`` hung: every process of it stopped (SIGSTOP) for the block, continued
    (SIGCONT) after. Connections stay open and the kernel still accepts new ones, but
    nothing answers: the fault a deadline is for."""
    pids = server.processes()
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)


@contextmanager
def private_postgres() -> Iterator[PrivatePostgres]:
    """A running private PostgreSQL; stopped and deleted at the end."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-pg-") as folder:
        server = PrivatePostgres(Path(folder))
        server.start()
        try:
            yield server
        finally:
            try:
                server.stop()
            except subprocess.CalledProcessError:
                pass  # the test left it stopped


@contextmanager
def private_redis() -> Iterator[PrivateRedis]:
    """A running private Redis; stopped at the end."""
    with tempfile.TemporaryDirectory(prefix="flowsvc-redis-") as folder:
        server = PrivateRedis(Path(folder))
        server.start()
        try:
            yield server
        finally:
            server.stop()


def _free_cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free as well, neither handed out
    before (so no two nodes of a cluster share a port or a node's bus port)."""
    while True:
        port = free_port()
        if port + 10000 < 65536 and claim_port(port + 10000):
            return port


def _cli(port: int, *args: str) -> str:
    return subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True,
                          text=True, timeout=10).stdout


class PrivateRedisCluster:
    """A Redis Cluster of one test module on loopback: 3 masters with one replica each,
    keeping nothing on disk but its ``nodes.conf`` files. ``kill_master`` SIGKILLs the master
    of a key (its replica is promoted after ``NODE_TIMEOUT_MS`` and an election);
    ``restart`` brings the killed node back, as a replica of the promoted one."""

    NODE_TIMEOUT_MS = 1000

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.ports = [_free_cluster_port() for _ in range(6)]
        self.url = "redis+cluster://" + ",".join(f"127.0.0.1:{port}" for port in self.ports[:3])
        self._processes: dict[int, subprocess.Popen[bytes]] = {}

    def _start_node(self, port: int) -> None:
        assert port not in self._processes, f"a node already runs on port {port}"
        node_dir = self.folder / str(port)
        node_dir.mkdir(exist_ok=True)
        self._processes[port] = subprocess.Popen(
            ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(node_dir), "--cluster-enabled", "yes",
             "--cluster-config-file", "nodes.conf",
             "--cluster-node-timeout", str(self.NODE_TIMEOUT_MS),
             "--cluster-replica-validity-factor", "0"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while _cli(port, "ping").strip() != "PONG":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {port} did not start")
            time.sleep(0.02)

    def start(self) -> None:
        for port in self.ports:
            self._start_node(port)
        created = subprocess.run(
            ["redis-cli", "--cluster", "create", *(f"127.0.0.1:{port}" for port in self.ports),
             "--cluster-replicas", "1", "--cluster-yes"], capture_output=True, text=True,
            timeout=60)
        if created.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{created.stdout}")
        self.wait_healthy()

    def wait_healthy(self, timeout: float = 30) -> None:
        """Until every running node says ``cluster_state:ok`` and every replica is in sync."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            infos = [_cli(port, "cluster", "info") + _cli(port, "info", "replication")
                     for port in self._processes]
            if all("cluster_state:ok" in info and "master_link_status:down" not in info
                   and "master_sync_in_progress:1" not in info for info in infos):
                return
            time.sleep(0.05)
        raise RuntimeError("the Redis Cluster did not become healthy")

    def master_of(self, key: str) -> int:
        """The port of the master that holds ``key``'s slot."""
        any_port = next(iter(self._processes))
        slot = int(_cli(any_port, "cluster", "keyslot", key))
        for line in _cli(any_port, "cluster", "nodes").splitlines():
            _id, address, flags = line.split()[:3]
            if "master" not in flags or "fail" in flags:
                continue
            for span in line.split()[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= slot <= int(high or low):
                    return int(address.split("@")[0].rpartition(":")[2])
        raise RuntimeError(f"no master holds slot {slot}")

    def kill_master(self, key: str) -> int:
        """SIGKILL the master of ``key``'s slot; its port."""
        port = self.master_of(key)
        process = self._processes.pop(port)
        process.kill()
        process.wait()
        return port

    def restart(self, port: int) -> None:
        self._start_node(port)
        self.wait_healthy()

    def stop(self) -> None:
        for process in self._processes.values():
            process.kill()
            process.wait()
        self._processes.clear()


@contextmanager
def private_redis_cluster() -> Iterator[PrivateRedisCluster]:
    """A running private Redis Cluster (3 masters, 3 replicas); stopped at the end."""
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        raise RuntimeError("a Redis Cluster test needs redis-server and redis-cli: "
                           "apt-get install redis-server")
    with tempfile.TemporaryDirectory(prefix="flowsvc-redis-cluster-") as folder:
        cluster = PrivateRedisCluster(Path(folder))
        try:
            cluster.start()
            yield cluster
        finally:
            cluster.stop()
