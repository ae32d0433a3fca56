"""``flowsvc`` commands in their own processes, for tests where the process boundary is the point.

``serving`` starts several ``flowsvc serve`` processes at once and stops them together, so
a cross-process test pays one start-up, not one per process (``tests.support.server.
server_process`` serves one). ``run_flowsvc`` runs a command to its end. Output is read
only at the end, into a pipe: keep a served process to a few hundred requests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

from tests.support.server import ROOT, _wait_ready


def spawn(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
    """``flowsvc ARGS`` in the repository with ``env`` over ours; output (both streams) piped."""
    argv = [sys.executable, "-m", "runtime.cli", "--config", os.devnull, *args]
    return subprocess.Popen(argv, cwd=ROOT,
                            env={**os.environ, **env}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)


def serve(env: dict[str, str], port: int, *args: str) -> subprocess.Popen[bytes]:
    """``flowsvc serve`` on ``port``, once it answers ``/healthz``; stop it with ``stop``."""
    process = spawn(env, "serve", "--bind", f"127.0.0.1:{port}", *args)
    try:
        _wait_ready(process, port)
    except BaseException:
        stop([process])
        raise
    return process


def run_flowsvc(env: dict[str, str], *args: str, timeout: float = 60) -> tuple[int, str]:
    """Run ``flowsvc ARGS`` to its end; its exit code and output."""
    process = spawn(env, *args)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop([process])
        raise
    return process.returncode, output.decode()


def stop(processes: list[subprocess.Popen[bytes]], timeout: float = 15) -> list[str]:
    """SIGTERM every process still running, wait for all, and return their outputs."""
    for process in processes:
        if process.poll() is None:
            process.terminate()
    outputs = []
    for process in processes:
        try:
            output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        outputs.append(output.decode())
    return outputs


@contextmanager
def serving(env: dict[str, str], ports: list[int], *args: str
            ) -> Iterator[list[subprocess.Popen[bytes]]]:
    """``flowsvc serve`` on each of ``ports``, started together; stopped with SIGTERM at the end."""
    processes = [spawn(env, "serve", "--bind", f"127.0.0.1:{port}", *args) for port in ports]
    try:  # all start at once; then each is waited for
        for process, port in zip(processes, ports, strict=True):
            _wait_ready(process, port)
        yield processes
    finally:
        stop(processes)
