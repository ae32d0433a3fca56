"""Usage rollups: each key's calls, cost and latency per minute, hour and day, by kind,
model and outcome, so that a key's usage costs the same to answer at 10 million log rows
as at 1,000.

They are written in the transaction that writes the usage rows (``add``), so the rollups
and the log never disagree. A total since a moment (``totals``) reads the whole days from
the day rollups, the whole hours before the first day from the hour rollups, the whole
minutes before the first hour from the minute rollups, and only the seconds before the
first minute from the log: at most 24 + 60 rollup rows and one minute of the key's log
(bounded by its rate limit) besides the days, whatever the log holds. A series
(``buckets``) reads the rollups whose width divides its buckets'.

Rollup rows are upserted in one order (their primary key), so two transactions adding to
the same rows wait for each other and never deadlock. They are kept as long as the log
(``[plugins.keys] usage_retention_days``, with the same cutoff: ``runtime.retention``).
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple, Protocol

from sqlalchemy import Connection, and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from plugins.keys.tables import api_key_usage, api_key_usage_rollups
from runtime.wire import as_utc

MINUTE, HOUR, DAY = 60, 3600, 86400
RESOLUTIONS = (MINUTE, HOUR, DAY)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
ERRORS = ("402", "429", "4xx", "5xx")
# A call without a model is counted under this name, as the usage answers name it.
NO_MODEL = "unknown"


class Call(Protocol):
    """What a rollup counts of a usage row (``usage.UsageEntry`` is one)."""

    @property
    def key_id(self) -> int: ...
    @property
    def at(self) -> datetime: ...
    @property
    def kind(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def status(self) -> int | None: ...
    @property
    def cost(self) -> int: ...
    @property
    def latency_us(self) -> int | None: ...


class Group(NamedTuple):
    """What a key's calls of one kind, model and outcome add up to."""

    key_id: int
    kind: str
    model: str
    outcome: str
    calls: int
    cost: int
    latency_us: int


def outcome(status: int | None) -> str:
    """``ok`` (below 400), ``402``, ``429``, ``4xx``, ``5xx``; ``none`` for a charge."""
    if status is None:
        return "none"
    if status < 400:
        return "ok"
    if status in (402, 429):
        return str(status)
    return "4xx" if status < 500 else "5xx"


def bucket_start(moment: datetime, seconds: int) -> datetime:
    """The start of the ``seconds`` wide bucket (counted from the Unix epoch) of ``moment``."""
    elapsed = (as_utc(moment) - _EPOCH) // timedelta(seconds=seconds)
    return _EPOCH + timedelta(seconds=elapsed * seconds)


def _next_boundary(moment: datetime, seconds: int) -> datetime:
    start = bucket_start(moment, seconds)
    return start if start == moment else start + timedelta(seconds=seconds)


def _upsert(connection: Connection) -> Any:
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    statement = dialect.insert(api_key_usage_rollups)
    added = statement.excluded
    table = api_key_usage_rollups.c
    return statement.on_conflict_do_update(
        index_elements=[column.name for column in api_key_usage_rollups.primary_key],
        set_={"calls": table.calls + added.calls, "cost": table.cost + added.cost,
              "latency_us": table.latency_us + added.latency_us})


def add(connection: Connection, calls: Iterable[Call]) -> None:
    """Add ``calls`` to their minute, hour and day rollups, in the caller's transaction."""
    sums: dict[tuple[int, int, datetime, str, str, str], list[int]] = {}
    for call in calls:
        group = (call.kind, NO_MODEL if call.model is None else call.model,
                 outcome(call.status))
        for seconds in RESOLUTIONS:
            figures = sums.setdefault(
                (call.key_id, seconds, bucket_start(call.at, seconds), *group), [0, 0, 0])
            figures[0] += 1
            figures[1] += call.cost
            figures[2] += call.latency_us or 0
    if not sums:
        return
    names = [column.name for column in api_key_usage_rollups.primary_key]
    connection.execute(_upsert(connection), [
        {**dict(zip(names, key, strict=True)), "calls": calls, "cost": cost,
         "latency_us": latency}
        for key, (calls, cost, latency) in sorted(sums.items())])


def totals(connection: Connection, key_ids: list[int], since: datetime | None) -> list[Group]:
    """What each of ``key_ids`` did since ``since`` (everything kept when None), by kind,
    model and outcome: the rollups that fit whole in the range, and the log before the
    first whole minute."""
    rollups = api_key_usage_rollups.c
    found: dict[tuple[int, str, str, str], list[int]] = {}
    if since is None:
        ranges: Any = rollups.bucket_seconds == DAY
    else:
        minute, hour, day = (_next_boundary(since, seconds) for seconds in RESOLUTIONS)
        ranges = or_(
            and_(rollups.bucket_seconds == MINUTE, rollups.bucket_start >= minute,
                 rollups.bucket_start < hour),
            and_(rollups.bucket_seconds == HOUR, rollups.bucket_start >= hour,
                 rollups.bucket_start < day),
            and_(rollups.bucket_seconds == DAY, rollups.bucket_start >= day))
        usage = api_key_usage.c
        for row in connection.execute(
                select(usage.key_id, usage.kind, usage.model, usage.status, usage.cost,
                       usage.latency_us)
                .where(usage.key_id.in_(key_ids), usage.at >= since, usage.at < minute)):
            figures = found.setdefault(
                (row.key_id, row.kind, NO_MODEL if row.model is None else row.model,
                 outcome(row.status)), [0, 0, 0])
            figures[0] += 1
            figures[1] += row.cost
            figures[2] += row.latency_us or 0
    summed = connection.execute(
        select(rollups.key_id, rollups.kind, rollups.model, rollups.outcome,
               func.sum(rollups.calls).label("calls"), func.sum(rollups.cost).label("cost"),
               func.sum(rollups.latency_us).label("latency_us"))
        .where(rollups.key_id.in_(key_ids), ranges)
        .group_by(rollups.key_id, rollups.kind, rollups.model, rollups.outcome))
    for group in summed:
        figures = found.setdefault((group.key_id, group.kind, group.model, group.outcome),
                                   [0, 0, 0])
        figures[0] += int(group.calls)
        figures[1] += int(group.cost)
        figures[2] += int(group.latency_us)
    return [Group(*key, *figures) for key, figures in found.items()]


def buckets(connection: Connection, key_id: int, since: datetime, width: int
            ) -> list[tuple[int, Group]]:
    """The key's calls from ``since`` (a multiple of ``width`` seconds from the epoch) in
    buckets of ``width`` seconds: each bucket's number from ``since`` with its groups."""
    seconds = max(resolution for resolution in RESOLUTIONS if width % resolution == 0)
    rollups = api_key_usage_rollups.c
    rows = connection.execute(
        select(rollups.bucket_start, rollups.kind, rollups.model, rollups.outcome,
               rollups.calls, rollups.cost, rollups.latency_us)
        .where(rollups.key_id == key_id, rollups.bucket_seconds == seconds,
               rollups.bucket_start >= since))
    return [((as_utc(row.bucket_start) - since) // timedelta(seconds=width),
             Group(key_id, row.kind, row.model, row.outcome, row.calls, row.cost,
                   row.latency_us))
            for row in rows]
