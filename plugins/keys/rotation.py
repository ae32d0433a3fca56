"""Rotate a key: a new key with the same name and limits, while the old one keeps working
for a chosen overlap, so that deployments can move over without an outage.

The old key's ``revoked_at`` is set to the end of the overlap (now, for an overlap of 0): a
key whose ``revoked_at`` is in the future works until then, in every process, with no
further write, since each check compares it with the clock. It leaves the list of active
keys at once, and can still be revoked at once with ``DELETE``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response
from quart_schema import document_response, validate_request
from sqlalchemy import Connection, update

from plugins.keys.directory import announce_change
from plugins.keys.records import KeyRecord, get_owned, insert_key, new_raw_key
from plugins.keys.routes import CreatedKeyBody, KeyBody, _public
from plugins.keys.state import KEYS
from plugins.keys.tables import api_keys
from runtime import idempotency
from runtime.context import current_context, require_user
from runtime.errors import NotFound
from runtime.http import current_service, json_response
from runtime.inputs import Body
from runtime.wire import utcnow

MAX_OVERLAP_SECONDS = 7 * 86400

blueprint = Blueprint("keys_rotation", __name__)


class RotateKey(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [{"overlap_seconds": 3600}]})
    overlap_seconds: int = Field(0, ge=0, le=MAX_OVERLAP_SECONDS,
                                       description="how long the old key keeps working")


class RotatedKeyResponse(BaseModel):
    key: CreatedKeyBody
    previous: KeyBody


def rotate(connection: Connection, user_id: int, key_id: int, raw_key: str, overlap: int,
           max_keys: int, now: datetime) -> tuple[KeyRecord, KeyRecord] | None:
    """The new key and the old one, ending after ``overlap`` seconds; None when ``user_id``
    has no such active key. The old key does not count against ``max_keys``."""
    current = get_owned(connection, user_id, key_id)
    if current is None or current.revoked_at is not None:
        return None
    new = insert_key(connection, user_id=user_id, name=current.name,
                     rate_limit_rpm=current.rate_limit_rpm, spend_limit=current.spend_limit,
                     spend_period=current.spend_period, raw_key=raw_key,
                     max_keys=max_keys + 1, now=now)
    connection.execute(update(api_keys).where(api_keys.c.id == key_id).values(
        revoked_at=now + timedelta(seconds=overlap), updated_at=now))
    previous = get_owned(connection, user_id, key_id)
    assert previous is not None
    return new, previous


@blueprint.post("/me/api-keys/<int:key_id>/rotate")
@validate_request(RotateKey)
@document_response(RotatedKeyResponse, 201)
async def rotate_route(key_id: int, data: RotateKey) -> Response:
    """A new key with this key's name and limits (the raw key in this response only); the
    old key keeps working for ``overlap_seconds``, then answers 401."""
    service = current_service()
    principal = require_user()
    state = service.state(KEYS)
    raw_key = new_raw_key()

    def write(connection: Connection) -> tuple[KeyRecord, KeyRecord]:
        rotated = rotate(connection, principal.user_id, key_id, raw_key,
                         data.overlap_seconds, state.settings.max_keys_per_user, utcnow())
        if rotated is None:
            raise NotFound(f"you have no active API key {key_id}")
        return rotated

    def replay(rotated: tuple[KeyRecord, KeyRecord]) -> idempotency.StoredResponse:
        new, previous = rotated
        body = {"key": {**new.public(0, new.created_at), "raw_key": None},
                "previous": previous.public(0, new.created_at)}
        return idempotency.StoredResponse(201, json.dumps(body, separators=(",", ":")).encode(),
                                          "application/json")

    new, previous = await idempotency.write_with_replay(service.db, current_context(), write,
                                                        replay)
    await announce_change(state.directory, service.shared, key_id)
    new_body, previous_body = await _public(state, [new, previous])
    return json_response({"key": {**new_body, "raw_key": raw_key}, "previous": previous_body},
                         201)
