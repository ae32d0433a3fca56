"""Request and response bodies of the webhook routes (they also document /openapi.json)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from runtime.inputs import Body, Time

DeliveryState = Literal["pending", "delivered", "failed"]


class CreateWebhookRequest(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [
        {"url": "https://hooks.example.com/flowsvc", "events": ["subscription.granted"]}]})
    url: str = Field(min_length=1, max_length=2048,
                     description="https URL that receives the signed POSTs")
    events: list[str] = Field(max_length=100, description="event names; [] means every event "
                              "type, including types added later")


class RecoverRequest(Body):
    since: Time = Field(description="re-send failed deliveries of events from this time")
    until: Time | None = Field(None, description="up to this time (default: now)")


class DeliveriesQuery(BaseModel):
    limit: int = Field(20, ge=1, description="page size; more than 100 is clamped to 100")
    cursor: str | None = Field(None, pattern=r"^[0-9]{1,19}$", description="nextCursor of the "
                               "previous page")
    state: DeliveryState | None = None
    event: str | None = Field(None, min_length=1, max_length=128, description="only "
                              "deliveries of this event type (e.g. webhook.ping)")


class WebhookOut(BaseModel):
    id: str
    url: str
    events: list[str]
    created_at: str
    last_error: str | None
    last_error_at: str | None
    secret: str | None = Field(None, description="only when created or rotated; not in the "
                               "replay of a repeated Idempotency-Key")


class WebhookResponse(BaseModel):
    webhook: WebhookOut


class WebhookListResponse(BaseModel):
    webhooks: list[WebhookOut]


class EventTypeOut(BaseModel):
    name: str
    description: str


class EventTypesResponse(BaseModel):
    events: list[EventTypeOut]


class AttemptOut(BaseModel):
    attempt: int
    at: str
    duration_ms: int
    status_code: int | None
    error: str | None
    outcome: Literal["delivered", "retry", "failed", "unknown"] = Field(
        description="unknown: not settled, either in flight now or its process stopped (or "
                    "lost its lease) before recording the answer; it may have reached the "
                    "receiver")


class DeliveryOut(BaseModel):
    event_id: str
    event: str
    state: DeliveryState
    created_at: str
    next_attempt_at: str | None
    finished_at: str | None
    attempts: list[AttemptOut]


class DeliveryResponse(BaseModel):
    delivery: DeliveryOut


class DeliveryListResponse(BaseModel):
    deliveries: list[DeliveryOut]
    nextCursor: str | None


class RecoverResponse(BaseModel):
    recovered: int
