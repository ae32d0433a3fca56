"""The durable log of a stream's events: sequence numbers, rows, SSE frames, Redis mirror.

Each stream (one per project) numbers its events 1, 2, 3... in ``project_stream_heads``;
an event is committed to ``project_stream_events`` before anyone can see it, and the
rows beyond the newest ``keep`` (the replay ring) are trimmed as the log grows. With
Redis, committed events are also appended to a Redis Stream (entry id ``0-<seq>``,
trimmed to about ``keep`` entries) that the other service processes tail. The Redis
Streams are spread over ``STREAM_PARTITIONS`` hash tags, so that on a Redis Cluster the
streams of one partition can be read with one XREAD.
"""

from __future__ import annotations

import json
import logging
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.projects.tables import stream_events, stream_heads
from runtime.shared import RedisAccess, StreamEntry
from runtime.shared_cluster import partition_tags
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.projects.eventlog")
_TRIM_EVERY = 100
# Few, so that a process's blocking reads (one per partition on a cluster) stay few; more
# than the masters of a usual cluster, so that the reads spread over all of them.
STREAM_PARTITIONS = 8


@dataclass(frozen=True)
class StreamEvent:
    """One committed event: its number in the stream, its run, its name and JSON data."""

    seq: int
    run_id: str
    name: str
    data: str

    def frame(self) -> bytes:
        """The event as one Server-Sent Events frame (``data`` is one line of JSON)."""
        return f"id: {self.seq}\nevent: {self.name}\ndata: {self.data}\n\n".encode()


def encode_data(data: Mapping[str, Any]) -> str:
    """Event data as compact JSON text; JSON escapes line breaks, so it is one SSE line."""
    return json.dumps(data, separators=(",", ":"), default=str)


def _reserve(connection: Connection, stream: str, count: int) -> int:
    """Take the next ``count`` numbers of ``stream``; returns the last one taken."""
    where = stream_heads.c.stream == stream
    bump = update(stream_heads).where(where).values(last_seq=stream_heads.c.last_seq + count)
    if connection.execute(bump).rowcount == 0:
        try:
            with connection.begin_nested():
                connection.execute(insert(stream_heads).values(stream=stream, last_seq=count))
        except IntegrityError:  # another writer created the head first
            connection.execute(bump)
    return int(connection.execute(select(stream_heads.c.last_seq).where(where)).scalar_one())


def append_events(connection: Connection, stream: str, run_id: str,
                  items: Sequence[tuple[str, str]], keep: int) -> list[StreamEvent]:
    """Number and store ``items`` (name, JSON data) at the end of ``stream``.

    :param keep: how many of the newest events the log keeps (the replay ring).
    """
    if not items:
        return []
    last = _reserve(connection, stream, len(items))
    first = last - len(items) + 1
    events = [StreamEvent(first + index, run_id, name, data)
              for index, (name, data) in enumerate(items)]
    now = utcnow()
    connection.execute(insert(stream_events), [
        {"stream": stream, "seq": event.seq, "run_id": run_id, "name": event.name,
         "data": event.data, "created_at": now} for event in events])
    if last // _TRIM_EVERY != (first - 1) // _TRIM_EVERY and last > keep:
        connection.execute(delete(stream_events).where(stream_events.c.stream == stream)
                           .where(stream_events.c.seq <= last - keep))
    return events


def run_events_after(connection: Connection, stream: str, run_id: str, after: int
                     ) -> list[StreamEvent]:
    """The events of ``run_id`` on ``stream`` numbered above ``after``, in order (what a
    commit whose outcome was not known wrote, if it committed)."""
    rows = connection.execute(
        select(stream_events).where(stream_events.c.stream == stream)
        .where(stream_events.c.seq > after).where(stream_events.c.run_id == run_id)
        .order_by(stream_events.c.seq))
    return _events(rows)


def last_seq(connection: Connection, stream: str) -> int:
    """The number of the stream's newest event (0 when it has none)."""
    value = connection.execute(select(stream_heads.c.last_seq)
                               .where(stream_heads.c.stream == stream)).scalar()
    return int(value or 0)


def _events(rows: Any) -> list[StreamEvent]:
    return [StreamEvent(row.seq, row.run_id, row.name, row.data) for row in rows]


def recent_events(connection: Connection, stream: str, limit: int
                  ) -> tuple[list[StreamEvent], int]:
    """The newest ``limit`` events of ``stream``, oldest first, and the stream's last number."""
    rows = connection.execute(
        select(stream_events).where(stream_events.c.stream == stream)
        .order_by(stream_events.c.seq.desc()).limit(limit))
    return list(reversed(_events(rows))), last_seq(connection, stream)


def events_between(connection: Connection, stream: str, after: int, upto: int
                   ) -> list[StreamEvent]:
    """The events numbered ``after + 1`` to ``upto``, in order."""
    rows = connection.execute(
        select(stream_events).where(stream_events.c.stream == stream)
        .where(stream_events.c.seq > after).where(stream_events.c.seq <= upto)
        .order_by(stream_events.c.seq))
    return _events(rows)


def stream_partition(stream: str) -> int:
    """The partition of ``stream`` (0 to ``STREAM_PARTITIONS - 1``): the streams of one
    partition share a hash slot on a Redis Cluster, so one XREAD may read them all."""
    return zlib.crc32(stream.encode()) % STREAM_PARTITIONS


def partition_tag(partition: int) -> str:
    """The hash tag of a partition's Redis keys."""
    return partition_tags(STREAM_PARTITIONS)[partition]


def redis_stream(stream: str) -> str:
    """The logical name of the Redis Stream that mirrors ``stream``, under its partition's
    hash tag: ``projects:{p<n>.<m>}:stream:<stream>``."""
    return f"projects:{partition_tag(stream_partition(stream))}:stream:{stream}"


async def mirror_to_redis(redis: RedisAccess, stream: str, events: Sequence[StreamEvent],
                          keep: int) -> None:
    """Append committed events to the stream's Redis Stream, trimmed to about ``keep``.

    An entry the stream already holds (a repeated batch) is refused by Redis and skipped.
    Failures are logged, not raised: the database holds every event, and a process that
    misses an entry fills the gap from it when the next entry arrives.
    """
    try:
        await redis.stream_add(redis_stream(stream), [
            (f"0-{event.seq}", {"run": event.run_id, "name": event.name, "data": event.data})
            for event in events], max_length=keep)
    except Exception:  # Redis down: the database still has the events
        log.warning("could not mirror %d events of %s to Redis", len(events), stream,
                    exc_info=True)


def event_from_entry(entry: StreamEntry) -> StreamEvent:
    """The event of a Redis Stream entry written by :func:`mirror_to_redis`."""
    fields = entry.fields
    return StreamEvent(int(entry.identifier.partition("-")[2]), fields["run"], fields["name"],
                       fields["data"])
