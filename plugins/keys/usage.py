"""The usage log: one row per key request or charge. Requests are written in batches by
``keys.usage``; a charge's row is written by the charge's own transaction
(``plugins.keys.charging``), so no charge is ever missing from the log.

Requests never wait for it. Each request appends its entry to the actor's bounded buffer
(``usage_buffer`` entries) without yielding to Trio: no task switch and no wake-up per
entry (a mailbox message costs a checkpoint each, which under load made the writer fall
behind). An entry that does not fit is dropped and counted
(``flowsvc_keys_usage_dropped_total`` and ``GET /readyz``), so a slow or failing database
slows no request. The actor wakes at the first entry, lets ``usage_flush_seconds`` of
entries gather, then writes them ``usage_batch`` at a time, one transaction each, which
also moves each key's ``last_used_at`` forward once: no write per request.

**A database outage loses nothing until the buffer is full.** A batch that fails because
the database is unavailable (``runtime.errors.is_outage``) goes back to the front of the
buffer, and the writer waits (``runtime.backoff``: jittered, at most 5 s) and tries again,
so the rows land, each once, seconds after the database returns. Meanwhile new entries
queue behind them; once the buffer holds ``usage_buffer`` entries, new ones are dropped
and counted as ``overflow`` (at 10,000 entries, about a minute of 150 key requests a
second per process). A batch refused for any other reason (a bug, bad data) is dropped
and counted as ``write_failed``, so that it cannot block the log. What is buffered when
the service stops is written before the actor ends (within 3 s; what cannot be written
then is counted as ``write_failed``). Rows older than ``usage_retention_days`` are dropped
by the core's retention actor (``runtime.retention``: by day partitions on PostgreSQL), with
their rollups.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any, Literal, NamedTuple

import trio
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy import Connection, insert, or_, select, update

from plugins.keys import rollups
from plugins.keys.tables import api_key_usage, api_keys
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import Backoff, outage_cause
from runtime.errors import is_outage
from runtime.storage import Database
from runtime.wire import as_utc, format_flow, iso

log = logging.getLogger("flowsvc.keys")
USAGE_ACTOR = "keys.usage"


class UsageEntry(NamedTuple):
    """One line of a key's usage log; ``method``, ``route``, ``status`` and ``latency_us``
    are None for a charge made by a plugin. (A named tuple: one is made per key request.)"""

    key_id: int
    at: datetime
    kind: Literal["request", "charge"]
    method: str | None
    route: str | None
    status: int | None
    cost: int
    model: str | None
    latency_us: int | None
    request_id: str | None = None  # the request's X-Request-Id


class UsageLog:
    """The usage log's buffer: filled by requests, emptied by the ``keys.usage`` actor.

    :param capacity: entries it holds at most; more are dropped and counted.
    :param metrics: the service's collector registry.
    """

    def __init__(self, capacity: int, metrics: CollectorRegistry) -> None:
        self._capacity = capacity
        self._entries: list[UsageEntry] = []
        self._arrived = trio.Event()
        self._dropped = Counter("flowsvc_keys_usage_dropped",
                                "API key usage entries dropped, by reason",
                                ["reason"], registry=metrics)
        self.dropped: dict[str, int] = {"overflow": 0, "write_failed": 0}

    def log(self, entry: UsageEntry) -> None:
        """Buffer ``entry`` for the writer, or drop and count it when the buffer is full."""
        if len(self._entries) >= self._capacity:
            self.count_dropped("overflow", 1)
            return
        self._entries.append(entry)
        if len(self._entries) == 1:
            self._arrived.set()

    async def wait(self) -> None:
        """Wait until the buffer holds an entry (the actor's side)."""
        if not self._entries:
            self._arrived = trio.Event()
            await self._arrived.wait()

    def take(self) -> list[UsageEntry]:
        """Everything buffered, leaving the buffer empty (the actor's side)."""
        entries, self._entries = self._entries, []
        return entries

    def put_back(self, entries: list[UsageEntry]) -> None:
        """Return entries that could not be written to the front of the buffer, in order
        (the actor's side); the newest entries past the capacity are dropped and counted."""
        self._entries = entries + self._entries
        excess = len(self._entries) - self._capacity
        if excess > 0:
            del self._entries[-excess:]
            self.count_dropped("overflow", excess)

    def count_dropped(self, reason: str, entries: int) -> None:
        self.dropped[reason] += entries
        self._dropped.labels(reason=reason).inc(entries)

    def status(self) -> dict[str, Any]:
        """Buffered and dropped entries (a detail of ``GET /readyz``; never makes it fail)."""
        return {"buffered": len(self._entries),
                "dropped_overflow": self.dropped["overflow"],
                "dropped_write_failed": self.dropped["write_failed"]}


def write_entries(connection: Connection, entries: list[UsageEntry]) -> None:
    """Insert ``entries``, add them to their rollups and move each key's ``last_used_at``
    to its newest entry."""
    connection.execute(insert(api_key_usage), [
        {"key_id": entry.key_id, "at": entry.at, "kind": entry.kind, "method": entry.method,
         "route": entry.route, "status": entry.status, "cost": entry.cost,
         "model": entry.model, "latency_us": entry.latency_us,
         "request_id": entry.request_id} for entry in entries])
    newest: dict[int, datetime] = {}
    for entry in entries:
        newest[entry.key_id] = max(entry.at, newest.get(entry.key_id, entry.at))
    for key_id, at in newest.items():
        connection.execute(update(api_keys).where(
            api_keys.c.id == key_id,
            or_(api_keys.c.last_used_at.is_(None), api_keys.c.last_used_at < at))
            .values(last_used_at=at))
    rollups.add(connection, entries)


def usage_actor(db: Database, usage: UsageLog, *, batch: int, flush_seconds: float
                ) -> ActorSpec:
    """The ``keys.usage`` actor: writes ``usage``'s buffer to the database in batches."""

    async def write(entries: list[UsageEntry]) -> list[UsageEntry]:
        """Write ``entries`` in batches; those not written because of an outage."""
        for start in range(0, len(entries), batch):
            chunk = entries[start:start + batch]
            try:
                await db.write(write_entries, chunk)
            except Exception as exc:
                if is_outage(exc):
                    log.warning("usage log: %d entries wait for the database (%s)",
                                len(entries) - start, outage_cause(exc))
                    return entries[start:]
                # Not an outage: this batch would fail again and block the log behind it.
                usage.count_dropped("write_failed", len(chunk))
                log.error("dropped %d usage entries: the database refused them", len(chunk),
                          exc_info=True)
        return []

    async def writer() -> None:
        backoff = Backoff()
        while True:
            await usage.wait()
            await trio.sleep(flush_seconds)  # let a batch gather
            unwritten = await write(usage.take())
            if unwritten:
                usage.put_back(unwritten)
                await trio.sleep(backoff.next_delay())
            else:
                backoff.reset()

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer)
                task_status.started()
                async for envelope in mailbox:  # it takes no messages; it ends when closed
                    envelope.fail(TypeError("keys.usage takes no messages"))
                nursery.cancel_scope.cancel()
        finally:
            lost = usage.take()
            with trio.CancelScope(shield=True) as scope:
                scope.deadline = trio.current_time() + 3.0
                lost = await write(lost)
            if lost:
                usage.count_dropped("write_failed", len(lost))
                log.error("usage log: %d entries not written at shutdown", len(lost))

    return ActorSpec(name=USAGE_ACTOR, run=run, mailbox_size=1)


def summary(connection: Connection, key_id: int, since: datetime | None) -> dict[str, Any]:
    """Totals of a key's log since ``since`` (all that is kept when None), and by model,
    from its rollups (``plugins.keys.rollups``)."""
    totals = {"requests": 0, "charges": 0, "errors": 0, "cost": 0, "latency": 0}
    models: dict[str, dict[str, int]] = {}
    for group in rollups.totals(connection, [key_id], since):
        count_name = "requests" if group.kind == "request" else "charges"
        totals[count_name] += group.calls
        totals["errors"] += group.calls if group.outcome in rollups.ERRORS else 0
        totals["cost"] += group.cost
        totals["latency"] += group.latency_us
        model = models.setdefault(group.model or rollups.NO_MODEL,
                                  {"requests": 0, "charges": 0, "cost": 0})
        model[count_name] += group.calls
        model["cost"] += group.cost
    by_model = [{"model": name, "requests": figures["requests"], "charges": figures["charges"],
                 "cost_flow": format_flow(figures["cost"])}
                for name, figures in sorted(models.items(), key=lambda item: (-item[1]["cost"],
                                                                             item[0]))]
    average = totals["latency"] / totals["requests"] / 1000 if totals["requests"] else None
    return {"requests": totals["requests"], "charges": totals["charges"],
            "errors": totals["errors"], "cost_flow": format_flow(totals["cost"]),
            "avg_latency_ms": None if average is None else round(average, 3),
            "by_model": by_model}


def recent(connection: Connection, key_id: int, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` entries of a key's log, newest first, in their public shape."""
    usage = api_key_usage.c
    rows = connection.execute(select(api_key_usage).where(usage.key_id == key_id)
                              .order_by(usage.at.desc(), usage.id.desc()).limit(limit))
    return [{"at": iso(as_utc(row.at)), "kind": row.kind, "method": row.method,
             "route": row.route, "status": row.status, "cost_flow": format_flow(row.cost),
             "model": row.model,
             "latency_ms": None if row.latency_us is None else round(row.latency_us / 1000, 3),
             "request_id": row.request_id}
            for row in rows]
