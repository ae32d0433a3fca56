"""Server-Sent Events: the parser, and the stream that resumes by itself.

A project's stream (``GET /projects/<slug>/stream``) and an agent run's stream number their
events 1, 2, 3... and replay everything after the ``Last-Event-ID`` a reader reconnects
with. ``EventStream`` reconnects whenever the connection ends or breaks, sends the id
of the last event it yielded, waits the ``retry:`` delay the server advertised between
attempts, and skips any event whose id it has already passed, so the caller sees each
event exactly once, in order, whatever happens to the connection.

Only the service can lose events: when the id a reader resumes from is older than its
replay ring (or one it does not know), it answers with a ``Last-Event-ID`` header naming
the id after which its replay starts (``-1``: from its first held event). The stream
records each such answer in ``EventStream.lost`` and, if asked, raises ``EventsLost``
before the first event of that replay.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import httpx

from flowsvc_client.errors import FlowsvcError, ServerError

DEFAULT_RETRY_SECONDS = 3.0
LOST_HEADER = "last-event-id"


@dataclass(frozen=True)
class Event:
    """One event: ``id`` (a string of digits for flowsvc streams), ``event`` (``plan``,
    ``tool_call``, ``tool_result``, ``message``, ``screenshot``, ``commit``, ``error``,
    ``done``) and ``data``, the decoded JSON (the raw text when it is not JSON)."""

    id: str | None
    event: str
    data: Any


@dataclass
class _Frame:
    id: str | None = None
    event: str = "message"
    data: list[str] | None = None
    retry_ms: int | None = None


def parse_events(lines: Iterable[str], on_retry: Callable[[float], None]) -> Iterator[Event]:
    """Events of an SSE body given line by line (no line ends), as the HTML standard reads
    them: ``data`` lines join with newlines, comments are skipped, an event is dispatched
    only at the blank line that ends it (so a connection cut mid-event yields nothing of
    it), and ``retry:`` is passed to ``on_retry`` in seconds."""
    frame = _Frame()
    for line in lines:
        if not line:
            if frame.data is not None:
                text = "\n".join(frame.data)
                yield Event(frame.id, frame.event, _decoded(text))
            frame = _Frame(id=frame.id)  # the id persists, as EventSource's last id does
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            frame.data = [*(frame.data or []), value]
        elif name == "event":
            frame.event = value
        elif name == "id" and "\0" not in value:
            frame.id = value
        elif name == "retry" and value.isdigit():
            on_retry(int(value) / 1000)


def _decoded(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _position(event_id: str | None) -> int | None:
    return int(event_id) if event_id is not None and event_id.isdigit() else None


OpenStream = Callable[[str | None], AbstractContextManager[httpx.Response]]


@dataclass(frozen=True)
class LostEvents:
    """The service could not replay everything after ``requested`` (the ``Last-Event-ID``
    sent): the events after it and up to ``replay_after`` are gone (out of its replay ring),
    or it did not know ``requested`` at all. Its replay starts after ``replay_after`` (the
    service's ``Last-Event-ID`` header; ``"-1"`` when it starts at the oldest event held)."""

    requested: str | None
    replay_after: str


class EventsLost(FlowsvcError):
    """Raised by an ``EventStream`` made with ``raise_on_lost=True`` when the service says
    events were lost, before the first event of its replay; ``lost`` says which. The stream
    stays usable: iterate it again to carry on with the replay."""

    def __init__(self, lost: LostEvents) -> None:
        super().__init__(f"events after {lost.requested} were lost; the replay starts "
                         f"after {lost.replay_after}")
        self.lost = lost


class EventStream(Iterator[Event]):
    """Events of the stream ``open_stream`` opens, across reconnections.

    :param open_stream: opens the stream with a ``Last-Event-ID`` (or none); raises
        ``ApiError`` for an error answer.
    :param last_event_id: resume after this id (None: the stream's own start).
    :param until_done: stop after the first ``done`` event (the end of a run).
    :param max_failures: consecutive attempts that fail to connect (network error or 5xx)
        before the last error is raised; an attempt that yields an event resets the count.
    :param raise_on_lost: raise ``EventsLost`` when the service says events were lost
        (else only record it in ``lost``).
    :raises ApiError: a 4xx answer (the stream does not exist, or is private).
    """

    def __init__(self, open_stream: OpenStream, *, last_event_id: str | None,
                 until_done: bool, sleep: Callable[[float], None], max_failures: int,
                 raise_on_lost: bool = False) -> None:
        self.lost: list[LostEvents] = []
        """Each time the service said events were lost, in order (empty: none were)."""
        self.raise_on_lost = raise_on_lost
        self._items = _resuming(open_stream, last_event_id=last_event_id,
                                until_done=until_done, sleep=sleep, max_failures=max_failures)

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> Event:
        while True:
            item = next(self._items)
            if isinstance(item, Event):
                return item
            self.lost.append(item)
            if self.raise_on_lost:
                raise EventsLost(item)

    def close(self) -> None:
        """Close the connection (a stream abandoned before its end)."""
        self._items.close()


def _resuming(open_stream: OpenStream, *, last_event_id: str | None, until_done: bool,
              sleep: Callable[[float], None], max_failures: int
              ) -> Generator[Event | LostEvents, None, None]:
    """The events, and a ``LostEvents`` before the replay of an answer that lost some."""
    delay = DEFAULT_RETRY_SECONDS
    position = _position(last_event_id)
    failures = 0

    def remember_delay(seconds: float) -> None:
        nonlocal delay
        delay = seconds

    while True:
        try:
            with open_stream(last_event_id) as response:
                replay_after = response.headers.get(LOST_HEADER)
                if replay_after is not None:
                    yield LostEvents(last_event_id, replay_after)
                    # The replay may start before the id sent (one the service did not
                    # know): nothing it sends now was yielded already.
                    position = _position(replay_after)
                for event in parse_events(response.iter_lines(), remember_delay):
                    current = _position(event.id)
                    if current is not None and position is not None and current <= position:
                        continue  # already yielded (a server that replayed too much)
                    position = current if current is not None else position
                    last_event_id = event.id if event.id is not None else last_event_id
                    failures = 0
                    yield event
                    if until_done and event.event == "done":
                        return
        except (httpx.TransportError, ServerError):
            failures += 1
            if failures >= max_failures:
                raise
        sleep(delay)
