"""A TCP proxy in front of PostgreSQL that can break a connection at its ``COMMIT``.

The service connects through it as to PostgreSQL; the bytes pass unchanged. Armed with
``cut_next(marker, after=...)``, it breaks the next connection that sent ``marker`` (a
table name, say) in its current transaction, at that transaction's ``COMMIT``: before the
``COMMIT`` reaches the server (nothing committed), or after the server committed and
before its answer reaches the client (committed, though the client cannot know). That is
the ambiguous commit a lost connection makes, produced on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

_COMMIT = b"COMMIT\x00"  # a simple-query COMMIT, and the server's CommandComplete tag


@dataclass
class _Cut:
    marker: bytes
    after: bool


class CommitCutter:
    """Forwards ``127.0.0.1:<port>`` to PostgreSQL at ``target_port``."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.cuts = 0
        self._armed: _Cut | None = None

    def cut_next(self, marker: str, *, after: bool) -> None:
        """Break the next transaction that sent ``marker`` at its ``COMMIT``; ``after``:
        once the server has committed it."""
        self._armed = _Cut(marker.encode(), after)

    async def serve(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED
                    ) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._connection, listeners)

    async def _connection(self, client: trio.SocketStream) -> None:
        try:
            await self._relay(client)
        except (trio.BrokenResourceError, OSError):
            pass  # one side hung up (or was cut): the other one follows

    async def _relay(self, client: trio.SocketStream) -> None:
        server = await trio.open_tcp_stream("127.0.0.1", self.target_port)
        state = {"marked": False, "commit_sent": False}
        async with client, server, trio.open_nursery() as nursery:

            async def upstream() -> None:
                async for chunk in client:
                    armed = self._armed
                    if armed is not None and armed.marker in chunk:
                        state["marked"] = True
                    if armed is not None and state["marked"] and _COMMIT in chunk:
                        if not armed.after:
                            self._cut()
                            nursery.cancel_scope.cancel()
                            return
                        state["commit_sent"] = True
                    await server.send_all(chunk)
                nursery.cancel_scope.cancel()

            async def downstream() -> None:
                async for chunk in server:
                    if state["commit_sent"] and _COMMIT in chunk:
                        self._cut()  # committed on the server; the client never hears it
                        nursery.cancel_scope.cancel()
                        return
                    await client.send_all(chunk)
                nursery.cancel_scope.cancel()

            nursery.start_soon(upstream)
            nursery.start_soon(downstream)

    def _cut(self) -> None:
        self._armed = None
        self.cuts += 1
