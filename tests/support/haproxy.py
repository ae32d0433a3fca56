"""HAProxy in front of ``flowsvc serve`` processes, with the configuration docs/ ships.

The shipped file (docs/haproxy/flowsvc.cfg) is run as it is: the listening address and the
backends reach it through the environment variables it expands, so the test exercises
exactly what a user copies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.support.server import ROOT, tls_context

HAPROXY = shutil.which("haproxy")
SHIPPED_CONFIG = ROOT / "docs" / "haproxy" / "flowsvc.cfg"


@contextmanager
def haproxy(port: int, backends: list[str], log_path: Path, timeout: float = 60.0
            ) -> Iterator[subprocess.Popen[bytes]]:
    """HAProxy on 127.0.0.1:``port`` in front of the ``backends`` (two ``address:port``),
    once it answers through each of them; its output (server state changes among it) goes
    to ``log_path``; stopped at the end."""
    assert HAPROXY is not None, "haproxy not found: install the Debian package haproxy"
    env = {**os.environ, "FLOWSVC_LISTEN": f"127.0.0.1:{port}",
           **{f"FLOWSVC_BACKEND_{index}": backend
              for index, backend in enumerate(backends, start=1)}}
    with log_path.open("wb") as log:
        process = subprocess.Popen([HAPROXY, "-db", "-f", str(SHIPPED_CONFIG)], env=env,
                                   stdout=log, stderr=subprocess.STDOUT)
        try:
            _wait_serving_through(process, port, len(backends), timeout)
            yield process
        except BaseException:
            print(log_path.read_text()[-3000:])  # HAProxy's log, shown with the failure
            raise
        finally:
            process.terminate()
            process.wait(timeout=10)


def _wait_serving_through(process: subprocess.Popen[bytes], port: int, backends: int,
                          timeout: float) -> None:
    """Until requests through HAProxy have been answered by every backend."""
    seen: set[str] = set()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"haproxy exited with {process.returncode}"
        try:
            answer = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2,
                               verify=tls_context())
            if answer.status_code == 200:
                seen.add(answer.headers["x-served-by"])
                if len(seen) == backends:
                    return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"haproxy on {port} reached only {sorted(seen)} in {timeout} s")
