"""SSE streams end when their process drains (``runtime.drain``), with a reconnect hint.

A process asked to stop ends every open stream at once: what it is writing finishes, then
the stream gets a short ``retry:`` and a comment, and ends. EventSource (and flowsvc's
client) reconnects after that delay with ``Last-Event-ID``, through the load balancer, to a
process that is not draining, and resumes after the last event it received: every event
once. A stream opened on a process that is already draining ends the same way at once.
The delays are spread over ``DRAIN_RETRY_MS`` to twice that, so the readers of a process
do not all arrive at the next one in the same instant.
"""

from __future__ import annotations

import random
from collections.abc import AsyncGenerator, AsyncIterator

from runtime.drain import Drain

DRAIN_RETRY_MS = 1000


def drain_hint() -> bytes:
    """The last frame of a stream ended by the drain."""
    retry_ms = random.randint(DRAIN_RETRY_MS, 2 * DRAIN_RETRY_MS)
    return (f"retry: {retry_ms}\n"
            ": this process is shutting down; reconnect with Last-Event-ID\n\n").encode()


async def ending_on_drain(drain: Drain, frames: AsyncGenerator[bytes, None]
                          ) -> AsyncIterator[bytes]:
    """``frames`` until they end or the drain begins; after the drain, ``drain_hint``.

    The drain cancels ``frames`` only while it waits for events (or for room in the
    queued-bytes budget), never in the middle of a write: a frame is sent whole or not at
    all, and the reader resumes after the last one it got.
    """
    try:
        while not drain.draining:
            piece: bytes | None = None
            with drain.cancel_scope():
                piece = await anext(frames, None)
            if piece is None:  # the stream ended, or the drain cut its wait short
                break
            yield piece
        if drain.draining:
            yield drain_hint()
    finally:
        await frames.aclose()
