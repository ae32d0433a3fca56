"""The registry proxy: only CONNECT to allowed hosts on public addresses, bridged into the
sandbox over a Unix socket when ``[sandbox] registries`` names hosts."""

from __future__ import annotations

import functools
from pathlib import Path

import trio

from runtime.sandbox.proxy import RegistryProxy
from tests.support.sandbox import probed_sandbox

CONNECT = "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n"


async def _ask(socket_path: Path, request: str) -> tuple[bytes, trio.SocketStream]:
    stream = await trio.open_unix_socket(str(socket_path))
    await stream.send_all(request.encode())
    head = b""
    while b"\r\n" not in head:
        chunk = await stream.receive_some(4096)
        if not chunk:
            break
        head += chunk
    return head, stream


async def test_the_proxy_refuses_all_but_connect_to_allowed_public_hosts(tmp_path: Path) -> None:
    socket_path = tmp_path / "proxy.sock"
    async with trio.open_nursery() as nursery:
        await nursery.start(RegistryProxy(frozenset({"localhost"})).serve, str(socket_path))
        for request, status in [
            ("GET http://localhost/ HTTP/1.1\r\n\r\n", b"HTTP/1.1 405"),
            (CONNECT.format(target="deb.debian.org:443"), b"HTTP/1.1 403"),
            (CONNECT.format(target="localhost:22"), b"HTTP/1.1 403"),
            (CONNECT.format(target="localhost:443"), b"HTTP/1.1 403"),  # not a public address
        ]:
            head, stream = await _ask(socket_path, request)
            await stream.aclose()
            assert head.startswith(status), (request, head)
        nursery.cancel_scope.cancel()


async def test_the_proxy_tunnels_to_an_allowed_host(tmp_path: Path) -> None:
    async def echo(stream: trio.SocketStream) -> None:
        async with stream:
            async for data in stream:
                await stream.send_all(data)

    socket_path = tmp_path / "proxy.sock"
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(functools.partial(trio.serve_tcp, echo, 0,
                                                           host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        proxy = RegistryProxy(frozenset({"localhost"}), port=port, public_only=False)
        await nursery.start(proxy.serve, str(socket_path))
        head, stream = await _ask(socket_path, CONNECT.format(target=f"localhost:{port}"))
        assert head.startswith(b"HTTP/1.1 200")
        await stream.send_all(b"through the tunnel")
        assert await stream.receive_some(100) == b"through the tunnel"
        await stream.aclose()
        nursery.cancel_scope.cancel()


async def test_a_sandboxed_command_reaches_only_the_proxy(tmp_path: Path) -> None:
    work_tree = tmp_path / "ws"
    work_tree.mkdir()
    sandbox = await probed_sandbox(registries=["localhost"])
    probe = ("import os, socket\nfor target in ('localhost:443', 'deb.debian.org:443'):\n"
             "    s = socket.create_connection(('127.0.0.1', 3128), 5)\n"
             "    s.sendall(f'CONNECT {target} HTTP/1.1\\r\\n\\r\\n'.encode())\n"
             "    print(target, s.recv(64).split(b'\\r\\n')[0].decode())\n"
             "print(os.environ['HTTPS_PROXY'])\n")
    (work_tree / "probe.py").write_text(probe)
    outcome = await sandbox.run(["python3", "probe.py"], work_tree)
    assert outcome.output.decode().splitlines() == [
        "localhost:443 HTTP/1.1 403 Forbidden", "deb.debian.org:443 HTTP/1.1 403 Forbidden",
        "http://127.0.0.1:3128"], outcome.output
    assert outcome.limits.described()["network"] == "https to localhost via the proxy"
