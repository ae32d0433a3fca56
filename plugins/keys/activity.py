"""What the caller's keys did: per-key counts for a window in one query, the request log
across all the caller's keys with filters, and its live tail over SSE.

The counts read the usage rollups (``plugins.keys.rollups``), the log reads the usage log
(``api_key_usage``), each limited to the caller's keys, so another user's calls are never in
reach. The tail follows the log by row id, which is also its SSE
event id: ``Last-Event-ID`` resumes after the last row seen, on any process, since the log is
in the database. Rows reach the log within ``usage_flush_seconds``; the tail polls every
``TAIL_POLL_SECONDS`` while nothing new is there.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import datetime, timedelta
from typing import Any, Literal

import trio
from pydantic import BaseModel, Field
from quart import Blueprint, Response, request
from quart_schema import document_response, validate_querystring
from sqlalchemy import Connection, func, select

from plugins.keys import rollups
from plugins.keys.tables import api_key_usage, api_keys
from runtime.context import require_user
from runtime.errors import InvalidRequest, NotFound
from runtime.http import SSE_HEADERS, current_service, json_response
from runtime.openapi import Success, answers
from runtime.wire import as_utc, format_flow, iso, utcnow

Window = Literal["hour", "day", "week", "month"]
WINDOWS = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(days=7),
           "month": timedelta(days=30)}
# The width of a chart's buckets per window: 12, 24, 28 and 30 buckets.
BUCKETS = {"hour": 300, "day": 3600, "week": 6 * 3600, "month": 86400}
LOG_MAX, TAIL_BATCH = 200, 100
TAIL_POLL_SECONDS, TAIL_HEARTBEAT_SECONDS = 0.25, 15.0
OUTCOMES = ("ok", "402", "429", "4xx", "5xx")

blueprint = Blueprint("keys_activity", __name__)


class StatsQuery(BaseModel):
    window: Window = "day"


class SeriesQuery(StatsQuery):
    by: Literal["outcome", "model"] = Field("outcome", description="outcome: each bucket's "
                                            "requests by outcome; model: each bucket's calls "
                                            "(requests and charges) and cost by model")


class LogQuery(BaseModel):
    key_id: int | None = Field(None, ge=1)
    status: int | None = Field(None, ge=100, le=599)
    route: str | None = Field(None, max_length=255)
    request_id: str | None = Field(None, max_length=128)
    limit: int = Field(50, ge=1)


class KeyStats(BaseModel):
    key_id: str
    requests: int
    charges: int
    outcomes: dict[str, int]
    cost_flow: str
    last_used_at: str | None


class StatsResponse(BaseModel):
    window: Window
    # The wire name is "from", a Python keyword.
    since: str = Field(alias="from")
    to: str
    keys: list[KeyStats]


class SeriesResponse(BaseModel):
    key_id: str
    window: Window
    by: Literal["outcome", "model"]
    models: list[str] | None = Field(None, description="by=model: every model in the "
                                     "window, most calls first")
    # The wire name is "from", a Python keyword.
    since: str = Field(alias="from")
    bucket_seconds: int
    buckets: list[dict[str, Any]]


class LogResponse(BaseModel):
    calls: list[dict[str, Any]]


def key_stats(connection: Connection, user_id: int, since: datetime) -> list[dict[str, Any]]:
    """Every key of ``user_id`` (and those revoked within the window) with its
    requests by outcome, charges and cost since ``since``, from the rollups."""
    keys = api_keys.c
    rows = connection.execute(
        select(keys.id, keys.last_used_at)
        .where(keys.user_id == user_id, keys.revoked_at.is_(None) | (keys.revoked_at >= since))
        .order_by(keys.id.desc())).all()
    counts = {row.id: {"requests": 0, "charges": 0, "cost": 0} for row in rows}
    outcomes = {row.id: dict.fromkeys(OUTCOMES, 0) for row in rows}
    for group in rollups.totals(connection, list(counts), since):
        counts[group.key_id]["requests" if group.kind == "request" else "charges"] += group.calls
        counts[group.key_id]["cost"] += group.cost
        if group.outcome in OUTCOMES:
            outcomes[group.key_id][group.outcome] += group.calls
    return [{"key_id": str(row.id), "requests": counts[row.id]["requests"],
             "charges": counts[row.id]["charges"], "outcomes": outcomes[row.id],
             "cost_flow": format_flow(counts[row.id]["cost"]),
             "last_used_at": iso(as_utc(row.last_used_at)) if row.last_used_at else None}
            for row in rows]


def _owns(connection: Connection, user_id: int, key_id: int) -> bool:
    keys = api_keys.c
    return connection.execute(select(keys.id).where(keys.id == key_id,
                                                    keys.user_id == user_id)).first() is not None


def key_series(connection: Connection, user_id: int, key_id: int, since: datetime,
               width: int, count: int) -> list[dict[str, Any]] | None:
    """The key's requests by outcome in ``count`` buckets of ``width`` seconds from
    ``since``, from the rollups; None when ``user_id`` has no such key."""
    if not _owns(connection, user_id, key_id):
        return None
    counted = [dict.fromkeys(OUTCOMES, 0) for _ in range(count)]
    for index, group in rollups.buckets(connection, key_id, since, width):
        if index < count and group.kind == "request" and group.outcome in OUTCOMES:
            counted[index][group.outcome] += group.calls
    return [{"from": iso(since + timedelta(seconds=index * width)), "outcomes": outcomes}
            for index, outcomes in enumerate(counted)]


def key_series_by_model(connection: Connection, user_id: int, key_id: int, since: datetime,
                        width: int, count: int
                        ) -> tuple[list[str], list[dict[str, Any]]] | None:
    """The key's calls (requests and charges) and their cost by model in ``count`` buckets
    of ``width`` seconds from ``since``, from the rollups, and the models, most calls
    first; None when ``user_id`` has no such key."""
    if not _owns(connection, user_id, key_id):
        return None
    counted: dict[int, dict[str, list[int]]] = {}
    totals: dict[str, int] = {}
    for index, group in rollups.buckets(connection, key_id, since, width):
        figures = counted.setdefault(index, {}).setdefault(group.model, [0, 0])
        figures[0] += group.calls
        figures[1] += group.cost
        totals[group.model] = totals.get(group.model, 0) + group.calls
    models = sorted(totals, key=lambda name: (-totals[name], name))
    return models, [{"from": iso(since + timedelta(seconds=index * width)),
                     "models": {model: {"calls": calls, "cost_flow": format_flow(cost)}
                                for model, (calls, cost) in counted.get(index, {}).items()}}
                    for index in range(count)]


def _public_call(row: Any) -> dict[str, Any]:
    return {"id": str(row.id), "key_id": str(row.key_id), "at": iso(as_utc(row.at)),
            "kind": row.kind, "method": row.method, "route": row.route, "status": row.status,
            "cost_flow": format_flow(row.cost), "model": row.model,
            "latency_ms": None if row.latency_us is None else round(row.latency_us / 1000, 3),
            "request_id": row.request_id}


def _callers_rows(user_id: int) -> Any:
    owned = select(api_keys.c.id).where(api_keys.c.user_id == user_id)
    return select(api_key_usage).where(api_key_usage.c.key_id.in_(owned))


def call_log(connection: Connection, user_id: int, query: LogQuery) -> list[dict[str, Any]]:
    """The newest calls of the caller's keys matching ``query``, newest first."""
    usage = api_key_usage.c
    select_rows = _callers_rows(user_id)
    if query.key_id is not None:
        select_rows = select_rows.where(usage.key_id == query.key_id)
    if query.status is not None:
        select_rows = select_rows.where(usage.status == query.status)
    if query.route:
        select_rows = select_rows.where(usage.route == query.route)
    if query.request_id:
        select_rows = select_rows.where(usage.request_id == query.request_id)
    rows = connection.execute(select_rows.order_by(usage.id.desc())
                              .limit(min(query.limit, LOG_MAX)))
    return [_public_call(row) for row in rows]


def calls_after(connection: Connection, user_id: int, after_id: int | None
                ) -> list[dict[str, Any]]:
    """The caller's calls logged after row ``after_id``, oldest first (None: only the id of
    the newest row, as the starting point of a fresh tail)."""
    usage = api_key_usage.c
    if after_id is None:
        newest = connection.execute(select(func.max(usage.id)).where(
            usage.key_id.in_(select(api_keys.c.id).where(api_keys.c.user_id == user_id)))
        ).scalar_one_or_none()
        return [{"id": str(newest or 0)}]
    rows = connection.execute(_callers_rows(user_id).where(usage.id > after_id)
                              .order_by(usage.id).limit(TAIL_BATCH))
    return [_public_call(row) for row in rows]


@blueprint.get("/me/api-keys/stats")
@validate_querystring(StatsQuery)
@document_response(StatsResponse, 200)
async def stats(query_args: StatsQuery) -> Response:
    """Every key's requests by outcome (ok, 402, 429, 4xx, 5xx), charges and cost in the
    window, and when it was last used: one call for all keys."""
    user_id = require_user().user_id
    now = utcnow()
    since = now - WINDOWS[query_args.window]
    keys = await current_service().db.read(key_stats, user_id, since)
    return json_response({"window": query_args.window, "from": iso(since), "to": iso(now),
                          "keys": keys})


@blueprint.get("/me/api-keys/<int:key_id>/series")
@validate_querystring(SeriesQuery)
@document_response(SeriesResponse, 200)
async def series(key_id: int, query_args: SeriesQuery) -> Response:
    """The key's requests by outcome (``by=outcome``), or its calls and cost by model
    (``by=model``), over time: 12 five-minute buckets for ``hour``, 24 hours for ``day``,
    28 six-hour buckets for ``week``, 30 days for ``month``."""
    user_id = require_user().user_id
    width = BUCKETS[query_args.window]
    count = int(WINDOWS[query_args.window].total_seconds()) // width
    now = utcnow()
    since = datetime.fromtimestamp((now.timestamp() // width + 1) * width - count * width,
                                   tz=now.tzinfo)
    db = current_service().db
    answer: dict[str, Any] = {"key_id": str(key_id), "window": query_args.window,
                              "by": query_args.by, "from": iso(since), "bucket_seconds": width}
    if query_args.by == "model":
        by_model = await db.read(key_series_by_model, user_id, key_id, since, width, count)
        if by_model is None:
            raise NotFound(f"you have no API key {key_id}")
        answer["models"], answer["buckets"] = by_model
    else:
        answer["buckets"] = await db.read(key_series, user_id, key_id, since, width, count)
        if answer["buckets"] is None:
            raise NotFound(f"you have no API key {key_id}")
    return json_response(answer)


@blueprint.get("/me/api-keys/calls")
@validate_querystring(LogQuery)
@document_response(LogResponse, 200)
async def calls(query_args: LogQuery) -> Response:
    """The request log of all the caller's keys, newest first, filtered by key, status,
    route and request id (the ``X-Request-Id`` the call was answered with); ``limit`` is
    clamped to 200."""
    user_id = require_user().user_id
    return json_response({"calls": await current_service().db.read(call_log, user_id,
                                                                   query_args)})


def _last_event_id() -> int | None:
    value = request.headers.get("Last-Event-ID")
    if value is None:
        return None
    if not value.isascii() or not value.isdigit() or len(value) > 18:
        raise InvalidRequest("Last-Event-ID must be an id this stream sent")
    return int(value)


@blueprint.get("/me/api-keys/tail")
@answers(Success(200, "text/event-stream"))
async def tail() -> Response:
    """The live tail of the caller's key calls (``text/event-stream``, event ``call``, id
    the log row): from now, or after ``Last-Event-ID``."""
    user_id = require_user().user_id
    after = _last_event_id()
    db = current_service().db
    if after is None:
        after = int((await db.read(calls_after, user_id, None))[0]["id"])

    async def events(after_id: int) -> AsyncIterator[bytes]:
        yield b"retry: 1000\n\n"
        quiet_since = trio.current_time()
        while True:
            batch = await db.read(calls_after, user_id, after_id)
            for call in batch:
                after_id = int(call["id"])
                yield (f"id: {after_id}\nevent: call\n"
                       f"data: {json.dumps(call, separators=(',', ':'))}\n\n").encode()
            if batch:
                quiet_since = trio.current_time()
            elif trio.current_time() - quiet_since >= TAIL_HEARTBEAT_SECONDS:
                yield b": heartbeat\n\n"
                quiet_since = trio.current_time()
            if len(batch) < TAIL_BATCH:
                await trio.sleep(TAIL_POLL_SECONDS)

    response = Response(events(after), headers=SSE_HEADERS)
    response.timeout = None
    return response
