"""Error codes of the billing plugin: the spec's Subscriptions group and the callbacks'."""

from runtime.errors import Conflict, InvalidRequest, ServiceError, Unauthenticated


class TierUnknown(InvalidRequest):
    """Raised when ``tier`` is not ``plus``, ``pro`` or ``max``."""

    code = "tier_unknown"


class ProviderUnsupported(InvalidRequest):
    """Raised when ``provider`` is not a provider enabled in this deployment."""

    code = "provider_unsupported"


class SubscriptionActive(Conflict):
    """Raised by a checkout while the caller's subscription still gives a tier."""

    code = "subscription_active"


class PaymentFailed(ServiceError):
    """Raised when the gateway declines the off-session charge of an upgrade."""

    status = 402
    code = "payment_failed"


class CallbackSignatureInvalid(Unauthenticated):
    """Raised when a provider callback's signature is missing, malformed or does not match."""

    code = "callback_signature_invalid"


class CallbackStale(InvalidRequest):
    """Raised when a signed callback's timestamp is more than 300 s from now."""

    code = "callback_stale"


class CallbackReplayed(Conflict):
    """Raised when a callback's event id was already processed (nothing changes)."""

    code = "callback_replayed"
