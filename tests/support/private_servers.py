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

from tests.support.server import free_port

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
