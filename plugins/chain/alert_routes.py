"""``PUT`` and ``GET /me/alerts/flow-balance``: the FLOW balance under which the caller hears
``flow.balance.low`` (``alerts``). The body and the answer are ``{"threshold": "<decimal>"}``,
a FLOW amount with at most 6 decimals, or null (no alert)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request
from quart_schema import document_request, document_response

from plugins.chain.alerts import WEI_PER_MICRO, get_threshold, set_threshold
from runtime.context import require_user
from runtime.errors import InvalidRequest
from runtime.http import current_service, json_response
from runtime.inputs import Body
from runtime.wire import format_flow, parse_flow

blueprint = Blueprint("chain_alerts", __name__)


class ThresholdBody(Body):
    """A FLOW amount as a decimal string (at most 6 decimals), or null to clear the alert."""

    threshold: str | None


@blueprint.put("/me/alerts/flow-balance")
@document_request(ThresholdBody)
@document_response(ThresholdBody, 200)
async def put_flow_balance_alert() -> Response:
    """Set (or clear with null) the caller's FLOW balance threshold."""
    user_id = require_user().user_id
    body: Any = await request.get_json()
    if not isinstance(body, dict) or set(body) != {"threshold"}:
        raise InvalidRequest("the body must be {\"threshold\": \"<decimal>\"} or "
                             "{\"threshold\": null}",
                             details=[{"field": "threshold", "message": "missing or extra keys"}])
    value = body["threshold"]
    if value is not None and not isinstance(value, str):
        raise InvalidRequest("threshold must be a decimal string such as \"10.5\", or null",
                             details=[{"field": "threshold", "message": "not a string"}])
    threshold = None if value is None else parse_flow(value, "threshold") * WEI_PER_MICRO
    await current_service().db.write(set_threshold, user_id, threshold)
    return json_response(_body(threshold))


@blueprint.get("/me/alerts/flow-balance")
@document_response(ThresholdBody, 200)
async def get_flow_balance_alert() -> Response:
    """The caller's FLOW balance threshold (null when none is set)."""
    user_id = require_user().user_id
    return json_response(_body(await current_service().db.read(get_threshold, user_id)))


def _body(threshold: int | None) -> dict[str, str | None]:
    return {"threshold": None if threshold is None else format_flow(threshold // WEI_PER_MICRO)}
