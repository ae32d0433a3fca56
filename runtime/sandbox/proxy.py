"""The allowlisting proxy through which sandboxed commands reach package registries.

The sandbox has no network; when ``[sandbox] registries`` names hosts, the service runs
this proxy on a Unix socket in a bridge folder mounted into the sandbox, where ``socat``
forwards ``127.0.0.1:3128`` to it and ``HTTP(S)_PROXY`` point there. It accepts only
``CONNECT <allowed host>:443`` (registries are HTTPS; what goes through the tunnel is TLS
it cannot read), resolves the name itself, refuses any address that is not public (no
loopback, private, link-local or metadata address, whatever the name resolves to), and
connects to the checked address. Everything else is answered 403 or 405 and closed.
"""

from __future__ import annotations

import functools
import ipaddress
import logging
import os

import trio

log = logging.getLogger("flowsvc.sandbox.proxy")
PROXY_PORT = 3128
PROXY_SOCKET = "proxy.sock"
_HEAD_BYTES = 8192
_HEAD_SECONDS = 10.0
_IDLE_SECONDS = 60.0


class _Refused(Exception):
    """A request the proxy answers with an error status line."""

    def __init__(self, status: str, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class RegistryProxy:
    """Tunnels HTTPS to the allowed hosts only.

    :param hosts: host names allowed, lower case, matched exactly.
    :param port: the only port tunnelled to (443; tests use a loopback port).
    :param public_only: refuse addresses that are not globally routable (tests turn it
        off to reach a fake registry on loopback).
    """

    def __init__(self, hosts: frozenset[str], *, port: int = 443,
                 public_only: bool = True) -> None:
        self.hosts = hosts
        self.port = port
        self.public_only = public_only

    async def serve(self, socket_path: str,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve on a Unix socket at ``socket_path`` until cancelled."""
        listener = trio.socket.socket(trio.socket.AF_UNIX)
        await listener.bind(socket_path)
        # The folder it is in is the sandbox uid's alone; the sandbox must connect to it.
        os.chmod(socket_path, 0o666)  # noqa: S103
        listener.listen()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(
                trio.serve_listeners, self._handle, [trio.SocketListener(listener)]))
            task_status.started()

    async def _handle(self, client: trio.SocketStream) -> None:
        async with client:
            try:
                with trio.fail_after(_HEAD_SECONDS):
                    target = await self._target(client)
                upstream = await self._connect(*target)
            except (_Refused, trio.TooSlowError, OSError) as exc:
                status = exc.status if isinstance(exc, _Refused) else "502 Bad Gateway"
                log.info("sandbox proxy refused: %s", exc)
                await _answer(client, f"HTTP/1.1 {status}\r\nConnection: close\r\n\r\n{exc}\n")
                return
            async with upstream:
                await client.send_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(_pump, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(_pump, upstream, client, nursery.cancel_scope)

    async def _target(self, client: trio.SocketStream) -> tuple[str, int]:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = await client.receive_some(_HEAD_BYTES)
            if not chunk or len(head) + len(chunk) > _HEAD_BYTES:
                raise _Refused("400 Bad Request", "no complete request head")
            head += chunk
        method, _, rest = head.split(b"\r\n", 1)[0].decode("latin-1").partition(" ")
        if method != "CONNECT":
            raise _Refused("405 Method Not Allowed", f"{method} refused: only CONNECT (HTTPS) "
                                                     "to the allowed registries")
        authority = rest.split(" ", 1)[0]
        host, _, port = authority.rpartition(":")
        host = host.lower()
        if host not in self.hosts or port != str(self.port):
            raise _Refused("403 Forbidden", f"{authority} is not an allowed registry")
        return host, self.port

    async def _connect(self, host: str, port: int) -> trio.SocketStream:
        found = await trio.socket.getaddrinfo(host, port, type=trio.socket.SOCK_STREAM)
        addresses = [str(info[4][0]) for info in found]
        allowed = [address for address in addresses
                   if not self.public_only or ipaddress.ip_address(address).is_global]
        if not allowed:
            raise _Refused("403 Forbidden", f"{host} resolves to no public address")
        # The checked address itself, not the name again: no second lookup to rebind.
        return await trio.open_tcp_stream(allowed[0], port)


async def _answer(client: trio.SocketStream, text: str) -> None:
    try:
        await client.send_all(text.encode())
    except trio.BrokenResourceError:
        return


async def _pump(source: trio.SocketStream, sink: trio.SocketStream,
                done: trio.CancelScope) -> None:
    """Copy one direction; its end is passed on (the other direction may still answer),
    a broken or idle connection ends both."""
    try:
        while True:
            with trio.fail_after(_IDLE_SECONDS):
                data = await source.receive_some(65536)
            if not data:
                await sink.send_eof()
                return
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError):
        done.cancel()
