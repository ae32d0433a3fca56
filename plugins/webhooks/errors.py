"""Error codes of the webhooks plugin (documented in docs/webhooks.md)."""

from runtime.errors import Conflict, InvalidRequest


class UrlRefused(InvalidRequest):
    """Raised (400) when a subscription URL is unsafe: wrong scheme, userinfo, an internal name,
    or a host that resolves to a loopback, private, link-local, multicast or reserved address."""

    code = "url_refused"


class EventUnknown(InvalidRequest):
    """Raised (400) when ``events`` names an event no enabled plugin declares."""

    code = "event_unknown"


class DeliveryPending(Conflict):
    """Raised (409) when redelivering an event whose delivery is still scheduled."""

    code = "delivery_pending"


class WebhookLimitReached(Conflict):
    """Raised (409) when the caller already has ``max_subscriptions`` subscriptions."""

    code = "webhook_limit_reached"
