"""``flowsvc`` commands in their own processes, for tests where the process boundary is the point.

``server_process`` serves one ``flowsvc serve``; ``serving`` starts several at once and
stops them together, so a cross-process test pays one start-up, not one per process.
``run_flowsvc`` runs a command to its end. A served process writes its output to a
temporary file, never to a pipe nobody reads (a full pipe would block its logging);
``stop`` returns that output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO

import httpx

from tests.support.server import ROOT, tls_context

# The output file of each served process, by pid, until ``stop`` reads it.
_LOGS: dict[int, IO[bytes]] = {}


def spawn(env: dict[str, str], *args: str, output: IO[bytes] | int = subprocess.PIPE
          ) -> subprocess.Popen[bytes]:
    """``flowsvc ARGS`` in the repository with ``env`` over ours; both streams to ``output``."""
    argv = [sys.executable, "-m", "runtime.cli", "--config", os.devnull, *args]
    return subprocess.Popen(argv, cwd=ROOT, env={**os.environ, **env}, stdout=output,
                            stderr=subprocess.STDOUT)


def _spawn_server(env: dict[str, str], port: int, *args: str) -> subprocess.Popen[bytes]:
    log = tempfile.TemporaryFile()
    process = spawn(env, "serve", "--bind", f"127.0.0.1:{port}", *args, output=log)
    _LOGS[process.pid] = log
    return process


def serve(env: dict[str, str], port: int, *args: str) -> subprocess.Popen[bytes]:
    """``flowsvc serve`` on ``port``, once it answers ``/healthz``; stop it with ``stop``."""
    process = _spawn_server(env, port, *args)
    try:
        _wait_ready(process, port)
    except BaseException:
        stop([process])
        raise
    return process


@contextmanager
def server_process(env: dict[str, str], port: int, *args: str
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """``flowsvc serve`` in its own process on ``port``; stopped with SIGTERM at the end."""
    process = serve(env, port, *args)
    try:
        yield process
    finally:
        stop([process])


def run_flowsvc(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run ``flowsvc ARGS`` to its end; its exit code and output."""
    process = spawn(env, *args)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop([process])
        raise
    return process.returncode, output.decode()


def _output(process: subprocess.Popen[bytes]) -> str:
    """What a finished process wrote (its log file or its pipe); closes either."""
    log = _LOGS.pop(process.pid, None)
    if log is None:
        output, _ = process.communicate()
        return output.decode()
    with log:
        log.seek(0)
        return log.read().decode()


def stop(processes: list[subprocess.Popen[bytes]], timeout: float = 15) -> list[str]:
    """SIGTERM every process still running, wait for all, and return their outputs."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return [_output(process) for process in processes]


@contextmanager
def serving(env: dict[str, str], ports: list[int], *args: str
            ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``flowsvc serve`` on each of ``ports``, started together; stopped with SIGTERM at the end."""
    processes = [_spawn_server(env, port, *args) for port in ports]
    try:  # all start at once; then each is waited for
        for process, port in zip(processes, ports, strict=True):
            _wait_ready(process, port)
        yield processes
    finally:
        stop(processes)


# Wide: several service processes starting at once on a loaded two-core machine have taken
# over 30 s to answer (a ready server answers at once, so the width costs nothing).
READY_TIMEOUT_SECONDS = 120.0


def _wait_ready(process: subprocess.Popen[bytes], port: int,
                timeout: float = READY_TIMEOUT_SECONDS) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            output = _output(process)
            raise RuntimeError(f"server exited with {process.returncode}:\n{output[-3000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1,
                         verify=tls_context()).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)
    process.kill()
    raise RuntimeError(f"server on port {port} did not become ready in {timeout} s")
