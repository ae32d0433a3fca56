"""flowsvc_client: a typed, blocking Python client of the flowsvc API (see README.md)."""

from flowsvc_client.client import Client
from flowsvc_client.errors import (
    ApiError,
    BadRequest,
    Conflict,
    FlowsvcError,
    Forbidden,
    NotFound,
    RateLimited,
    ServerError,
    SpendCapReached,
    Unauthenticated,
    WebhookSignatureError,
)
from flowsvc_client.events import Event, EventsLost, EventStream, LostEvents
from flowsvc_client.webhooks import verify_webhook

__all__ = [
    "ApiError", "BadRequest", "Client", "Conflict", "Event", "EventStream", "EventsLost",
    "FlowsvcError", "Forbidden", "LostEvents", "NotFound", "RateLimited", "ServerError",
    "SpendCapReached", "Unauthenticated", "WebhookSignatureError", "verify_webhook",
]
