"""Inbound provider callbacks: ``POST /billing/webhooks/<provider>`` (docs/billing.md).

The raw body is verified before anything reads it (the provider's signature scheme, secrets
compared in constant time). A verified event is recorded under its event id in
``billing_callbacks`` in the same transaction as what it causes: a replay of an event
already processed is refused with ``409 callback_replayed`` and changes nothing, and the
payment it confirms is settled by ``payments.settle`` (granted at most once). Forged
callbacks get ``401 callback_signature_invalid``, stale ones ``400 callback_stale``; both
change nothing. The routes are counted in the anonymous per-IP request bucket like any
request without credentials.
"""

from __future__ import annotations

import time

from pydantic import BaseModel
from quart import Blueprint, Response, request
from quart_schema import document_response
from sqlalchemy import Connection, insert
from sqlalchemy.exc import IntegrityError

from plugins.billing import payments
from plugins.billing.errors import CallbackReplayed
from plugins.billing.state import BILLING
from plugins.billing.tables import callbacks
from runtime.errors import NotFound
from runtime.http import current_service, json_response
from runtime.wire import utcnow


class CallbackResponse(BaseModel):
    received: bool
    outcome: str


blueprint = Blueprint("billing_callbacks", __name__)


@blueprint.post("/billing/webhooks/<provider_name>")
@document_response(CallbackResponse, 200)
async def provider_callback(provider_name: str) -> Response:
    """A provider's signed event; ``outcome`` is ``ignored`` for events that pay nothing."""
    service = current_service()
    provider = service.state(BILLING).providers.get(provider_name)
    if provider is None or not provider.callbacks:
        raise NotFound(f"no callbacks are taken for provider {provider_name!r}")
    raw = await request.get_data(cache=True, as_text=False)
    assert isinstance(raw, bytes)
    headers = {name.lower(): value for name, value in request.headers.items()}
    confirmation = provider.verify_callback(headers, raw, time.time())

    def record(connection: Connection) -> str:
        try:
            with connection.begin_nested():
                connection.execute(insert(callbacks).values(
                    provider=provider.name, event_id=confirmation.event_id,
                    received_at=utcnow()))
        except IntegrityError:
            raise CallbackReplayed(f"event {confirmation.event_id} was already processed; "
                                   f"nothing changed") from None
        if confirmation.payment is None:
            return "ignored"
        return payments.settle(service, connection, confirmation.payment)

    outcome = await service.db.write(record)
    return json_response({"received": True, "outcome": outcome})
