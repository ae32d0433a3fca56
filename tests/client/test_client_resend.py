"""A request on a kept-alive connection that closes as the request arrives (a drain, an idle
timeout) is sent again on a new connection when that is safe, and never otherwise.

Between the client and a real service, a loopback relay forwards each connection's first
request and its answer, then resets the connection when the client sends a second request on
it, unforwarded: what a client sees when a server closes a kept-alive connection just as a
request arrives on it.
"""

from __future__ import annotations

import socket
import struct
from pathlib import Path

import httpx
import pytest
import trio
from flowsvc_client import Client

from tests.support.server import make_settings, running_server, settings_env

ADDRESS = "0x" + "ab" * 20


class ResettingRelay:
    """Relays loopback connections to ``port``, and resets each at its second request."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.connections = 0
        self.resets = 0

    async def serve(self, *, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}")
        await trio.serve_listeners(self._relay, listeners)

    async def _relay(self, client: trio.SocketStream) -> None:
        self.connections += 1
        answered = trio.Event()
        async with client, await trio.open_tcp_stream("127.0.0.1", self.port) as upstream:

            async def answers() -> None:
                async for data in upstream:
                    await client.send_all(data)
                    answered.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(answers)
                async for data in client:
                    if answered.is_set():  # a second request: reset, never forwarded
                        self.resets += 1
                        client.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                                 struct.pack("ii", 1, 0))
                        break
                    await upstream.send_all(data)
                nursery.cancel_scope.cancel()


async def test_a_request_on_a_connection_reset_under_it_is_sent_again_only_when_safe(
        tmp_path: Path) -> None:
    env = settings_env(tmp_path / "var", database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
                       plugins=["auth"], extra={"FLOWSVC_LIMITS_ANONYMOUS_RPM": "0"})
    async with running_server(make_settings(env), env) as running, \
            trio.open_nursery() as nursery:
        relay = ResettingRelay(int(running.base_url.rsplit(":", 1)[1]))
        url = await nursery.start(relay.serve)
        await trio.to_thread.run_sync(_scenario, url, relay)
        nursery.cancel_scope.cancel()


def _scenario(url: str, relay: ResettingRelay) -> None:
    with Client(url) as flow:
        assert flow.request("GET", "/healthz")["status"] == "ok"
        # The kept-alive connection is reset under the second GET: sent again, answered.
        assert flow.request("GET", "/healthz")["status"] == "ok"
        assert (relay.resets, relay.connections) == (1, 2)

        # A POST may have done its work before the reset: without Idempotency-Key it is not
        # sent twice, and the caller hears of the failure (a reset, or the end it is read as).
        with pytest.raises((httpx.ReadError, httpx.RemoteProtocolError)):
            flow.request("POST", "/auth/nonce", json={"address": ADDRESS})
        assert (relay.resets, relay.connections) == (2, 2)

        # With one, a repeat is answered once by the service: sent again.
        assert flow.request("GET", "/healthz")["status"] == "ok"
        nonce = flow.request("POST", "/auth/nonce", json={"address": ADDRESS},
                             headers={"Idempotency-Key": "resend-1"})
        assert nonce["nonce"]
        assert (relay.resets, relay.connections) == (3, 4)
