"""anvil processes (from the npm package ``@foundry-rs/anvil``) on free loopback ports.

``make node_modules`` installs the binary; it ships in a platform package such as
``@foundry-rs/anvil-linux-amd64``, which is run directly (not through ``npx``, whose Node.js
wrapper would be a second process to stop). Each anvil listens on a port it picks itself
(``--port 0``) and reports, so several run at once without racing for ports. Its output goes to
a temporary file, never to an unread pipe.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx
import trio

from tests.support.server import ROOT, tls_context

DEFAULT_CHAIN_ID = 31337  # anvil's own default
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0
_LISTENING = re.compile(rb"Listening on 127\.0\.0\.1:(\d+)")


def anvil_binary() -> Path:
    """The anvil executable under ``node_modules``.

    :raises RuntimeError: not installed (the message says to run ``make node_modules``).
    """
    found = sorted(ROOT.glob("node_modules/@foundry-rs/anvil-*/bin/anvil"))
    if not found:
        raise RuntimeError("anvil is not installed: run `make node_modules` (needs Node.js/npm)")
    return found[0]


@dataclass
class Anvil:
    """A running anvil; ``stop`` ends it and returns what it printed."""

    process: subprocess.Popen[bytes]
    log: IO[bytes]
    port: int
    chain_id: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> str:
        """SIGTERM (SIGKILL past ``STOP_TIMEOUT_SECONDS``); call once: it closes the log."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        output = self.output()
        self.log.close()
        return output


def start_anvil(chain_id: int = DEFAULT_CHAIN_ID, *, block_time: float | None = None
                ) -> Anvil:
    """Start anvil on 127.0.0.1 and return once it answers ``eth_chainId`` with ``chain_id``.

    :param block_time: seconds between blocks (interval mining); default: a block per
        transaction (automine).
    :raises RuntimeError: it exited, or did not answer within ``START_TIMEOUT_SECONDS``.
    """
    argv = [str(anvil_binary()), "--host", "127.0.0.1", "--port", "0",
            "--chain-id", str(chain_id)]
    if block_time is not None:
        argv += ["--block-time", str(block_time)]
    # Append mode: anvil writes at the end even while we seek and read the shared file.
    log = tempfile.TemporaryFile(mode="a+b")
    process = subprocess.Popen(argv, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT)
    anvil = Anvil(process, log, 0, chain_id)
    try:
        _wait_ready(anvil)
    except BaseException:
        anvil.stop()
        raise
    return anvil


def _wait_ready(anvil: Anvil) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if anvil.process.poll() is not None:
            raise RuntimeError(f"anvil exited with {anvil.process.returncode}:\n"
                               f"{anvil.output()[-3000:]}")
        if not anvil.port:
            anvil.log.seek(0)
            match = _LISTENING.search(anvil.log.read())
            anvil.port = int(match.group(1)) if match else 0
        if anvil.port and _answers(anvil):
            return
        time.sleep(0.05)
    raise RuntimeError(f"anvil did not answer within {START_TIMEOUT_SECONDS} s:\n"
                       f"{anvil.output()[-3000:]}")


def _answers(anvil: Anvil) -> bool:
    request = {"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}
    try:
        reply = httpx.post(anvil.url, json=request, timeout=2, verify=tls_context()).json()
    except httpx.HTTPError:
        return False
    return int(reply["result"], 16) == anvil.chain_id


@contextmanager
def running_anvil(chain_id: int = DEFAULT_CHAIN_ID, *, block_time: float | None = None
                  ) -> Iterator[Anvil]:
    """``start_anvil`` for the block; stopped at its end (for sync, module-scoped fixtures)."""
    anvil = start_anvil(chain_id, block_time=block_time)
    try:
        yield anvil
    finally:
        anvil.stop()


@asynccontextmanager
async def open_anvil(chain_id: int = DEFAULT_CHAIN_ID, *, block_time: float | None = None
                     ) -> AsyncIterator[Anvil]:
    """``running_anvil`` in a Trio test: start and stop run in worker threads."""
    anvil = await trio.to_thread.run_sync(
        lambda: start_anvil(chain_id, block_time=block_time))
    try:
        yield anvil
    finally:
        await trio.to_thread.run_sync(anvil.stop)
