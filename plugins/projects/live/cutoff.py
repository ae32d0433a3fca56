"""Cutting off a reader whose write never finishes: resetting its TCP connection.

A stream's frames go out through hypercorn, which writes each one with ``send_all`` under a
shielded cancel scope and has no write timeout: a client that stops reading (its receive
window at zero) holds that write, its request task and its socket forever, and cancelling
the task does nothing. The connection is the one thing that can be ended from outside. The
app does not see hypercorn's socket, but it knows the connection's two endpoints (the ASGI
scope's ``server`` and ``client``), and the process's open sockets are listed in
``/proc/self/fd`` (Linux): :func:`reset_connections` finds the sockets with those endpoints,
makes their close a reset (``SO_LINGER`` 0, so the kernel frees the unsent data at once)
and shuts them down. The blocked ``send_all`` then fails, hypercorn ends the request and
closes the socket, and the reader's task exits as for any disconnect.

Finding the sockets costs a few system calls per open descriptor, so it runs in a worker
thread and only for readers already found stuck.
"""

from __future__ import annotations

import logging
import os
import socket
import struct
from collections.abc import Collection, Mapping
from typing import Any, NamedTuple

import trio

log = logging.getLogger("flowsvc.projects.cutoff")
_OPEN_DESCRIPTORS = "/proc/self/fd"
_RESET_ON_CLOSE = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


class Endpoints(NamedTuple):
    """One TCP connection as this process sees it: (host, port) here and at the peer."""

    local: tuple[str, int]
    peer: tuple[str, int]


def endpoints_of(scope: Mapping[str, Any]) -> Endpoints | None:
    """The endpoints of the connection an ASGI HTTP ``scope`` arrived on (None when the
    server did not say, as over a Unix socket)."""
    server, client = scope.get("server"), scope.get("client")
    if not server or not client or server[1] is None:
        return None
    return Endpoints((str(server[0]), int(server[1])), (str(client[0]), int(client[1])))


def _endpoints(sock: socket.socket) -> Endpoints | None:
    if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
        return None
    try:
        local, peer = sock.getsockname(), sock.getpeername()
    except OSError:  # a listener, or not connected any more
        return None
    return Endpoints((local[0], local[1]), (peer[0], peer[1]))


def reset_connections(targets: Collection[Endpoints]) -> int:
    """Reset this process's TCP connections with the endpoints in ``targets``.

    Blocking (runs in a worker thread). Never closes a descriptor: hypercorn still owns
    each one and closes it once its write has failed.

    :return: how many were found and reset.
    """
    wanted = set(targets)
    try:
        names = os.listdir(_OPEN_DESCRIPTORS)
    except OSError:
        log.warning("cannot list open sockets (%s): stuck readers stay connected",
                    _OPEN_DESCRIPTORS)
        return 0
    reset = 0
    for name in names:
        try:
            if not os.readlink(f"{_OPEN_DESCRIPTORS}/{name}").startswith("socket:"):
                continue
            sock = socket.socket(fileno=int(name))
        except (OSError, ValueError):
            continue  # closed meanwhile, or not a descriptor
        try:
            if _endpoints(sock) in wanted:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET_ON_CLOSE)
                sock.shutdown(socket.SHUT_RDWR)
                reset += 1
        except OSError:
            pass  # it went away by itself
        finally:
            sock.detach()
    return reset


async def reset_in_thread(targets: Collection[Endpoints]) -> int:
    """:func:`reset_connections` in a worker thread (nothing to do without targets)."""
    if not targets:
        return 0
    return await trio.to_thread.run_sync(reset_connections, targets)
