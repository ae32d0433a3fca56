"""The bare quart-trio hello-world that every benchmark measures flowsvc against.

It runs the same stack as the service (QuartTrio served by hypercorn's Trio worker, access log
off, hypercorn's default keep-alive) with nothing of flowsvc in it, so a ratio against it shows
what flowsvc itself costs.

Endpoints:

- ``GET /hello`` answers ``{"hello": "world"}``.
- ``GET /sse`` streams Server-Sent Events. It first sends the comment ``: subscribed`` (once a
  client has read it, every later publish reaches that client), then one event per publish.
- ``POST /publish`` sends its request body (UTF-8 text) as the ``data`` of one event to every
  open ``/sse`` stream and answers ``{"delivered": N}``, the number of streams it reached.

Each stream reads from its own bounded memory channel; a stream whose channel is full (a client
that does not keep up) is cut off rather than letting the publisher block or memory grow.

Run it with ``python -m bench.hello_app --bind 127.0.0.1:PORT``; SIGTERM or SIGINT stop it
gracefully.
"""

import argparse
import signal
from collections.abc import AsyncIterator, Sequence

import trio
from hypercorn.config import Config
from hypercorn.trio import serve
from quart import request
from quart_trio import QuartTrio

#: Events a stream may have queued before it counts as lagging and is cut off.
SUBSCRIBER_BUFFER = 64


class Broadcaster:
    """Fans every published event out to the memory channel of each open stream.

    It owns the send ends of the subscribers' channels: it closes the one of a subscriber
    that lags, and forgets the ones whose receive end was closed.
    """

    def __init__(self, buffer_size: int = SUBSCRIBER_BUFFER) -> None:
        self._buffer_size = buffer_size
        self._subscribers: set[trio.MemorySendChannel[bytes]] = set()
        self._last_id = 0

    def subscribe(self) -> trio.MemoryReceiveChannel[bytes]:
        """Open a channel that receives every event published from now on, SSE-encoded.

        The caller owns the returned receive end and closes it when its client goes away.
        """
        send, receive = trio.open_memory_channel[bytes](self._buffer_size)
        self._subscribers.add(send)
        return receive

    def publish(self, text: str) -> int:
        """Queue ``text`` as one SSE event for every subscriber, never blocking.

        :return: the number of subscribers the event was queued for.
        """
        self._last_id += 1
        data = "".join(f"data: {line}\n" for line in text.splitlines() or [""])
        event = f"id: {self._last_id}\n{data}\n".encode()
        delivered = 0
        for send in list(self._subscribers):
            try:
                send.send_nowait(event)
            except trio.WouldBlock:
                # A lagging client is cut off so that one slow reader never stalls the rest.
                send.close()
                self._subscribers.discard(send)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._subscribers.discard(send)
            else:
                delivered += 1
        return delivered


def create_app() -> QuartTrio:
    """Build the hello-world app with its own broadcaster (no module-level state)."""
    app = QuartTrio(__name__)
    broadcaster = Broadcaster()

    @app.get("/hello")
    async def hello() -> dict[str, str]:
        return {"hello": "world"}

    @app.post("/publish")
    async def publish() -> dict[str, int]:
        text = await request.get_data(cache=False, as_text=True, parse_form_data=False)
        return {"delivered": broadcaster.publish(text)}

    @app.get("/sse")
    async def sse() -> tuple[AsyncIterator[bytes], int, dict[str, str]]:
        # Subscribe before answering, so nothing published after the client reads
        # ": subscribed" can be missed.
        events = broadcaster.subscribe()

        async def stream() -> AsyncIterator[bytes]:
            with events:
                yield b": subscribed\n\n"
                async for event in events:
                    yield event

        headers = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}
        return stream(), 200, headers

    # Streams are open-ended: Quart's default 60 s response timeout would cut them.
    app.config["RESPONSE_TIMEOUT"] = None
    return app


def make_config(bind: str) -> Config:
    """Hypercorn settings the service uses too: access log off, keep-alive left at default."""
    config = Config()
    config.bind = [bind]
    config.accesslog = None
    return config


async def _wait_for_stop_signal() -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async for _ in signals:
            return


def main(argv: Sequence[str] | None = None) -> None:
    """Serve the hello-world app on ``--bind`` until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(description="Serve the bare quart-trio hello-world.")
    parser.add_argument("--bind", default="127.0.0.1:8000", help="HOST:PORT to listen on")
    args = parser.parse_args(argv)
    trio.run(
        lambda: serve(create_app(), make_config(args.bind), shutdown_trigger=_wait_for_stop_signal)
    )


if __name__ == "__main__":
    main()
