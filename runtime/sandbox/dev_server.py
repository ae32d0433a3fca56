"""A build's own dev server, for a screenshot: run in a command sandbox, reached through a
Unix-socket bridge.

Neither sandbox has a network the other can reach, so the dev server's sandbox runs
``socat UNIX-LISTEN`` on a socket in a bridge folder mounted into both, forwarding to the
server's port on its own loopback; the browser's sandbox forwards the same port on its own
loopback to that socket. The page is then ``http://127.0.0.1:<port>/...`` for the browser,
as it would be for a developer, and nothing of the host is reachable from either side.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import trio

from runtime.errors import ServiceError, Unavailable
from runtime.sandbox.jail import BRIDGE, Identity, Limits
from runtime.sandbox.runner import launch

T = TypeVar("T")
APP_SOCKET = "app.sock"
_POLL_SECONDS = 0.2


@dataclass(frozen=True)
class DevServer:
    """A command that serves the build over HTTP on ``port`` of the sandbox's loopback."""

    command: str
    port: int


def browser_forwarding(port: int) -> str:
    """The shell line that, inside the browser's sandbox, forwards ``port`` to the bridge."""
    return (f"socat TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr "
            f"UNIX-CONNECT:{BRIDGE}/{APP_SOCKET} & ")


async def _answers(socket_path: Path) -> bool:
    """Whether an HTTP server answers through the bridge (socat closes the connection at
    once while nothing listens on the port)."""
    try:
        stream = await trio.open_unix_socket(str(socket_path))
    except OSError:
        return False
    async with stream:
        try:
            await stream.send_all(b"HEAD / HTTP/1.0\r\nHost: localhost\r\n\r\n")
            with trio.move_on_after(2):
                return (await stream.receive_some(16)).startswith(b"HTTP/")
        except trio.BrokenResourceError:
            return False
    return False


async def with_dev_server(server: DevServer, work_tree: Path, identity: Identity,
                          limits: Limits, bridge: Path, wait_seconds: float,
                          body: Callable[[], Awaitable[T]]) -> T:
    """Start ``server`` in a sandbox, wait until it answers, run ``body``, then kill it.

    :raises Unavailable: the server did not answer within ``wait_seconds``.
    """
    argv = ["sh", "-c", f'sh -c "$1" </dev/null >/dev/null 2>&1 & exec socat '
                        f"UNIX-LISTEN:{BRIDGE}/{APP_SOCKET},fork TCP:127.0.0.1:{server.port}",
            "sh", server.command]
    # The server lives in a nursery around the body; the body's refusals are carried out of
    # it so callers see them as they are, not wrapped in an exception group.
    failure: ServiceError | None = None
    async with trio.open_nursery() as nursery:
        await nursery.start(functools.partial(launch, argv, work_tree, identity, limits,
                                              stdout=subprocess.DEVNULL, bridge=bridge))
        try:
            with trio.move_on_after(wait_seconds) as waiting:
                # Polled: the server is another process, with nothing to wait on but its
                # first answer.
                while True:
                    if await _answers(bridge / APP_SOCKET):
                        break
                    await trio.sleep(_POLL_SECONDS)
            if waiting.cancelled_caught:
                failure = Unavailable(f"the dev server did not answer on port {server.port} "
                                      f"within {wait_seconds:g} seconds")
            else:
                result = await body()
        except ServiceError as exc:
            failure = exc
        finally:
            nursery.cancel_scope.cancel()  # the server never outlives the screenshot
    if failure is not None:
        raise failure
    return result
