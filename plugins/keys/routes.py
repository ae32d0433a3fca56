"""Routes of the keys plugin: ``/me/api-keys`` and a key's usage and recent calls.

They accept a cookie session, a bearer session or an API key alike (``require_user``).
Views are module-level functions on ``blueprint``.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any, cast

from pydantic import BaseModel, ConfigDict, Field, StrictInt
from quart import Blueprint, Response, request
from quart_schema import document_response, validate_querystring, validate_request
from sqlalchemy import Connection

from plugins.keys.directory import announce_change
from plugins.keys.periods import SpendPeriod, UsageSince, since_time
from plugins.keys.records import (
    KeyRecord,
    get_owned,
    insert_key,
    list_active,
    new_raw_key,
    revoke,
    update_limits,
)
from plugins.keys.state import KEYS, KeysState
from plugins.keys.usage import recent, summary
from runtime import idempotency
from runtime.context import current_context, require_user
from runtime.errors import InvalidRequest, NotFound
from runtime.http import current_service, json_response
from runtime.inputs import Body, FlowsvcRequest, Label
from runtime.openapi import Success, answers
from runtime.wire import iso, parse_flow, utcnow

MAX_SPEND_LIMIT = 10**15  # micro-FLOW: 10^9 FLOW, far below 2^53 so Redis' Lua numbers stay exact
DEFAULT_RATE_LIMIT_RPM = 60
PAGE_DEFAULT, PAGE_MAX, RECENT_MAX = 20, 100, 200
NAME = Field(min_length=1, max_length=64)
FlowAmount = str | int | float | None


class CreateKey(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"name": "ci deploys", "rate_limit_rpm": 60, "spend_limit_flow": "25.000000",
         "spend_period": "month"}]})
    name: Label = NAME
    rate_limit_rpm: StrictInt = Field(DEFAULT_RATE_LIMIT_RPM, ge=0)
    spend_limit_flow: FlowAmount = Field(None, description="decimal string; omitted: no cap")
    spend_period: SpendPeriod = "month"


class PatchKey(Body):
    name: Label | None = Field(None, min_length=1, max_length=64)
    rate_limit_rpm: StrictInt | None = Field(None, ge=0)
    spend_limit_flow: FlowAmount = Field(None, description="decimal string; null: no cap")
    spend_period: SpendPeriod | None = None


class PageQuery(BaseModel):
    cursor: str | None = None
    limit: int = Field(PAGE_DEFAULT, ge=1)


class UsageQuery(BaseModel):
    since: UsageSince = "month"


class RecentQuery(BaseModel):
    limit: int | None = Field(None, ge=1)


class KeyBody(BaseModel):
    id: str
    name: str
    prefix: str
    rate_limit_rpm: int
    spend_limit_flow: str | None
    spend_period: SpendPeriod
    spend_period_used: str
    spend_period_reset: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None


class CreatedKeyBody(KeyBody):
    raw_key: str | None = Field(description="the raw key, in this response only; null in the "
                                            "replay of a repeated Idempotency-Key")


class CreatedKeyResponse(BaseModel):
    key: CreatedKeyBody


class KeyResponse(BaseModel):
    key: KeyBody


class KeyListResponse(BaseModel):
    keys: list[KeyBody]
    nextCursor: str | None


class UsageResponse(BaseModel):
    usage: dict[str, Any]


class RecentResponse(BaseModel):
    calls: list[dict[str, Any]]


async def _exact_field(name: str) -> Any:
    """A body field parsed without floats: JSON numbers come as ``Decimal``, so an amount
    with more than 6 decimals is refused instead of rounded."""
    body = await cast(FlowsvcRequest, request).exact_json()
    return body.get(name) if isinstance(body, dict) else None


async def _spend_limit() -> int | None:
    value = await _exact_field("spend_limit_flow")
    if value is None:
        return None
    micro = parse_flow(value, "spend_limit_flow")
    if micro > MAX_SPEND_LIMIT:
        raise _invalid("spend_limit_flow", "must be at most 1000000000 FLOW")
    return micro


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest(f"{field} {message}", details=[{"field": field, "message": message}])


def _check_rpm(state: KeysState, rpm: int | None) -> None:
    if rpm is not None and rpm > state.settings.max_rate_limit_rpm:
        raise _invalid("rate_limit_rpm", f"must be at most {state.settings.max_rate_limit_rpm}")


def _encode_cursor(key_id: int) -> str:
    return base64.urlsafe_b64encode(f"k{key_id}".encode()).decode().rstrip("=")


def _decode_cursor(cursor: str) -> int:
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if text.startswith("k") and text[1:].isascii() and text[1:].isdigit() \
                and len(text) < 24:
            return int(text[1:])
    except (binascii.Error, ValueError):  # non-ASCII text is a ValueError
        pass
    raise _invalid("cursor", "is not a cursor this endpoint returned")


async def _public(state: KeysState, records: list[KeyRecord]) -> list[dict[str, Any]]:
    now = utcnow()
    used = await state.meter.period_used(records, now)
    return [record.public(used[record.id], now) for record in records]


blueprint = Blueprint("keys", __name__)


async def _owned(key_id: int) -> KeyRecord:
    principal = require_user()
    record = await current_service().db.read(get_owned, principal.user_id, key_id)
    if record is None:
        raise NotFound(f"you have no API key {key_id}")
    return record


@blueprint.post("/me/api-keys")
@validate_request(CreateKey)
@document_response(CreatedKeyResponse, 201)
async def create(data: CreateKey) -> Response:
    """Create a key; the raw key is in this response and never again."""
    service = current_service()
    principal = require_user()
    state = service.state(KEYS)
    _check_rpm(state, data.rate_limit_rpm)
    spend_limit = await _spend_limit()
    raw_key = new_raw_key()
    # The raw key must never be stored: a repeated Idempotency-Key replays the key without it.

    def create_key(connection: Connection) -> KeyRecord:
        return insert_key(
            connection, user_id=principal.user_id, name=data.name,
            rate_limit_rpm=data.rate_limit_rpm, spend_limit=spend_limit,
            spend_period=data.spend_period, raw_key=raw_key,
            max_keys=state.settings.max_keys_per_user, now=utcnow())

    def replay(record: KeyRecord) -> idempotency.StoredResponse:
        body = json.dumps({"key": {**record.public(0, record.created_at), "raw_key": None}},
                          separators=(",", ":"))
        return idempotency.StoredResponse(201, body.encode(), "application/json")

    record = await idempotency.write_with_replay(service.db, current_context(), create_key,
                                                 replay)
    body = record.public(0, utcnow())
    return json_response({"key": {**body, "raw_key": raw_key}}, 201)


@blueprint.get("/me/api-keys")
@validate_querystring(PageQuery)
@document_response(KeyListResponse, 200)
async def list_keys(query_args: PageQuery) -> Response:
    """The caller's active keys, newest first, a page at a time."""
    service = current_service()
    principal = require_user()
    before = _decode_cursor(query_args.cursor) if query_args.cursor else None
    limit = min(query_args.limit, PAGE_MAX)
    records = await service.db.read(list_active, principal.user_id, before, limit + 1)
    page = records[:limit]
    next_cursor = _encode_cursor(page[-1].id) if len(records) > limit else None
    return json_response({"keys": await _public(service.state(KEYS), page),
                          "nextCursor": next_cursor})


@blueprint.patch("/me/api-keys/<int:key_id>")
@validate_request(PatchKey)
@document_response(KeyResponse, 200)
async def patch(key_id: int, data: PatchKey) -> Response:
    """Change the fields passed; a new ``spend_period`` starts again from 0."""
    service = current_service()
    principal = require_user()
    state = service.state(KEYS)
    passed = data.model_fields_set
    for field in ("name", "rate_limit_rpm", "spend_period"):
        if field in passed and getattr(data, field) is None:
            raise _invalid(field, "must not be null")
    _check_rpm(state, data.rate_limit_rpm)
    changes: dict[str, Any] = {field: getattr(data, field) for field in
                               ("name", "rate_limit_rpm", "spend_period") if field in passed}
    if "spend_limit_flow" in passed:
        changes["spend_limit"] = await _spend_limit()
    record = await service.db.write(update_limits, principal.user_id, key_id, changes, utcnow())
    if record is None:
        raise NotFound(f"you have no active API key {key_id}")
    await announce_change(state.directory, service.shared, key_id)
    return json_response({"key": (await _public(state, [record]))[0]})


@blueprint.delete("/me/api-keys/<int:key_id>")
@answers(Success(204))
async def delete(key_id: int) -> Response:
    """Revoke the key (204); it answers 401 from then on, everywhere."""
    service = current_service()
    principal = require_user()
    record = await service.db.write(revoke, principal.user_id, key_id, utcnow())
    if record is None:
        raise NotFound(f"you have no active API key {key_id}")
    await announce_change(service.state(KEYS).directory, service.shared, key_id)
    return Response("", status=204)


@blueprint.get("/me/api-keys/<int:key_id>/usage")
@validate_querystring(UsageQuery)
@document_response(UsageResponse, 200)
async def usage(key_id: int, query_args: UsageQuery) -> Response:
    """Totals of the key's usage log since the start of this day, week or month, or all."""
    record = await _owned(key_id)
    now = utcnow()
    start = since_time(query_args.since, now)
    totals = await current_service().db.read(summary, record.id, start)
    return json_response({"usage": {
        "key_id": str(record.id), "since": query_args.since,
        "from": None if start is None else iso(start), "to": iso(now), **totals}})


@blueprint.get("/me/api-keys/<int:key_id>/recent")
@validate_querystring(RecentQuery)
@document_response(RecentResponse, 200)
async def recent_calls(key_id: int, query_args: RecentQuery) -> Response:
    """The key's newest calls, newest first; ``limit`` is clamped to 200."""
    service = current_service()
    record = await _owned(key_id)
    limit = min(query_args.limit or service.state(KEYS).settings.recent_default_limit,
                RECENT_MAX)
    return json_response({"calls": await service.db.read(recent, record.id, limit)})
