"""One indexer step committing in the background while the next one is prepared (the
history ranges of ``actor``: the node is read while the database thread writes)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import trio

from plugins.chain.indexer.store import Step


class Committing:
    """At most one step committing in the background (in ``nursery``); ``wait`` returns once
    it is stored and raises what it raised."""

    def __init__(self, nursery: trio.Nursery,
                 commit: Callable[[Step], Awaitable[None]]) -> None:
        self.nursery = nursery
        self.commit = commit
        self.done: trio.Event | None = None
        self.error: Exception | None = None

    def start(self, step: Step) -> None:
        assert self.done is None, "one step at a time"
        done = self.done = trio.Event()

        async def run() -> None:
            try:
                await self.commit(step)
            except Exception as error:  # raised by wait(), in the indexer's own task
                self.error = error
            finally:
                done.set()

        self.nursery.start_soon(run)

    async def wait(self) -> None:
        if self.done is not None:
            await self.done.wait()
            self.done = None
        if self.error is not None:
            error, self.error = self.error, None
            raise error
