"""Routes of the webhooks plugin: /me/webhooks and everything under it.

Every route needs a caller (session, bearer or ``x-api-key``) and sees only the caller's own
subscriptions; another user's subscription answers 404 like a missing one. Views are
module-level functions on ``blueprint``; they find the service with ``current_service()`` and
the plugin's settings and URL policy with ``service.state(WEBHOOKS)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import urlsplit

from quart import Blueprint, Response
from quart_schema import document_response, validate_querystring, validate_request

from plugins.webhooks.deliveries import list_deliveries, recover, redeliver, send_ping
from plugins.webhooks.dispatcher import wake_dispatcher
from plugins.webhooks.errors import EventUnknown, UrlRefused
from plugins.webhooks.models import (
    CreateWebhookRequest,
    DeliveriesQuery,
    DeliveryListResponse,
    DeliveryResponse,
    EventTypesResponse,
    RecoverRequest,
    RecoverResponse,
    WebhookListResponse,
    WebhookResponse,
)
from plugins.webhooks.state import WEBHOOKS
from plugins.webhooks.subscriptions import (
    Subscription,
    create_subscription,
    delete_subscription,
    get_subscription,
    list_subscriptions,
    rotate_secret,
)
from runtime import idempotency
from runtime.context import current_context, require_user
from runtime.errors import InvalidRequest
from runtime.http import current_service, json_response
from runtime.netguard import UnsafeUrlError, UrlPolicy, normalize_host, resolve_and_check
from runtime.openapi import Success, answers
from runtime.service import Service
from runtime.wire import utcnow

MAX_PAGE = 100


def known_events(service: Service, names: list[str]) -> list[str]:
    """``names`` without repeats, in order.

    :raises EventUnknown: a name is not declared by any enabled plugin.
    """
    unknown = sorted({name for name in names if name not in service.event_types})
    if unknown:
        known = ", ".join(sorted(service.event_types)) or "none"
        raise EventUnknown(
            f"unknown event {', '.join(unknown)}; the known events are: {known}",
            details=[{"field": "events", "message": f"unknown event {name!r}"}
                     for name in unknown])
    return list(dict.fromkeys(names))


async def vetted_host(url: str, policy: UrlPolicy) -> str:
    """The normalized host of ``url`` once the SSRF guard accepts it (DNS included).

    :raises UrlRefused: the URL is unsafe or its host does not resolve.
    """
    try:
        await resolve_and_check(url, policy)
    except UnsafeUrlError as exc:
        raise UrlRefused(f"url refused: {exc}", details=[
            {"field": "url", "message": str(exc), "reason": exc.reason}]) from None
    return normalize_host(urlsplit(url).hostname or "")


async def _with_secret(status: int, change: Callable[..., Subscription], *args: Any
                       ) -> Response:
    """Run ``change(connection, *args)`` (it makes a secret) and answer ``status`` with the
    webhook and its new secret; a repeated ``Idempotency-Key`` replays it without the secret.
    """

    def replay(subscription: Subscription) -> idempotency.StoredResponse:
        body = json.dumps({"webhook": subscription.public()}, separators=(",", ":"))
        return idempotency.StoredResponse(status, body.encode(), "application/json")

    subscription = await idempotency.write_with_replay(
        current_service().db, current_context(), change, replay, *args)
    return json_response({"webhook": subscription.public(with_secret=True)}, status)


async def _scheduled(name: str, schedule: Callable[..., Any], *args: Any) -> Response:
    """Run ``schedule(connection, *args, max_retries)`` in a transaction that queues
    deliveries, wake the dispatcher, and answer 202 ``{name: <what it returned>}``."""
    service = current_service()
    result = await service.db.write(schedule, *args,
                                    service.state(WEBHOOKS).settings.max_retries)
    wake_dispatcher(service)
    return json_response({name: result}, 202)


blueprint = Blueprint("webhooks", __name__)


@blueprint.post("/me/webhooks")
@validate_request(CreateWebhookRequest)
@document_response(WebhookResponse, 201)
async def create(data: CreateWebhookRequest) -> Response:
    """Subscribe a URL to events; the answer holds the signing secret, shown only here."""
    service = current_service()
    principal = require_user()
    state = service.state(WEBHOOKS)
    events = known_events(service, data.events)
    host = await vetted_host(data.url, state.policy)
    return await _with_secret(201, create_subscription, principal.user_id, data.url, host,
                              events, state.settings.max_subscriptions)


@blueprint.get("/me/webhooks")
@document_response(WebhookListResponse, 200)
async def list_webhooks() -> Response:
    """The caller's subscriptions, with ``last_error`` (never the secret)."""
    principal = require_user()
    found = await current_service().db.read(list_subscriptions, principal.user_id)
    return json_response({"webhooks": [subscription.public() for subscription in found]})


@blueprint.get("/me/webhooks/events")
@document_response(EventTypesResponse, 200)
async def event_types() -> Response:
    """The catalogue of subscribable events, as the enabled plugins declare them."""
    require_user()
    return json_response({"events": [
        {"name": event.name, "description": event.description}
        for event in sorted(current_service().event_types.values(), key=lambda e: e.name)]})


@blueprint.get("/me/webhooks/<int:webhook_id>")
@document_response(WebhookResponse, 200)
async def get_webhook(webhook_id: int) -> Response:
    """One subscription."""
    principal = require_user()
    found = await current_service().db.read(get_subscription, principal.user_id, webhook_id)
    return json_response({"webhook": found.public()})


@blueprint.delete("/me/webhooks/<int:webhook_id>")
@answers(Success(204))
async def delete_webhook(webhook_id: int) -> Response:
    """Delete a subscription; its pending deliveries are not sent any more (204)."""
    principal = require_user()
    await current_service().db.write(delete_subscription, principal.user_id, webhook_id)
    return Response("", status=204)


@blueprint.post("/me/webhooks/<int:webhook_id>/rotate-secret")
@document_response(WebhookResponse, 200)
async def rotate(webhook_id: int) -> Response:
    """Replace the secret; the old one keeps signing for ``secret_overlap_seconds``."""
    service = current_service()
    principal = require_user()
    return await _with_secret(200, rotate_secret, principal.user_id, webhook_id,
                              service.state(WEBHOOKS).settings.secret_overlap_seconds)


@blueprint.post("/me/webhooks/<int:webhook_id>/test")
@document_response(DeliveryResponse, 202)
async def test_ping(webhook_id: int) -> Response:
    """Send a ``webhook.ping`` event to this subscription, signed like any other (202)."""
    principal = require_user()
    return await _scheduled("delivery", send_ping, principal.user_id, webhook_id)


@blueprint.get("/me/webhooks/<int:webhook_id>/deliveries")
@validate_querystring(DeliveriesQuery)
@document_response(DeliveryListResponse, 200)
async def deliveries(webhook_id: int, query_args: DeliveriesQuery) -> Response:
    """Recent deliveries, newest first, each with its attempts (status, error, timing);
    ``state`` and ``event`` keep only deliveries in that state, of that event type."""
    principal = require_user()
    items, cursor = await current_service().db.read(
        partial(list_deliveries, limit=min(query_args.limit, MAX_PAGE),
                before=int(query_args.cursor) if query_args.cursor else None,
                state=query_args.state, event=query_args.event),
        principal.user_id, webhook_id)
    return json_response({"deliveries": items, "nextCursor": cursor})


@blueprint.post("/me/webhooks/<int:webhook_id>/deliveries/<event_id>/redeliver")
@document_response(DeliveryResponse, 202)
async def redeliver_event(webhook_id: int, event_id: str) -> Response:
    """Send one event to this subscription again, with a fresh retry schedule (202)."""
    principal = require_user()
    return await _scheduled("delivery", redeliver, principal.user_id, webhook_id, event_id)


@blueprint.post("/me/webhooks/<int:webhook_id>/recover")
@validate_request(RecoverRequest)
@document_response(RecoverResponse, 202)
async def recover_failed(webhook_id: int, data: RecoverRequest) -> Response:
    """Re-send every failed delivery of events created since ``since`` (until ``until``)."""
    principal = require_user()
    until = data.until or utcnow()
    if data.since >= until:
        raise InvalidRequest("since must be before until", details=[
            {"field": "since", "message": "must be before until (default: now)"}])
    return await _scheduled("recovered", recover, principal.user_id, webhook_id, data.since,
                            until)

