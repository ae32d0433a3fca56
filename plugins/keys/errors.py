"""Error codes of the keys plugin (rate and spend refusals use the core's ``rate_limited``
and ``spend_cap_reached``)."""

from runtime.errors import Conflict, Unauthenticated


class ApiKeyInvalid(Unauthenticated):
    """Raised when an ``x-api-key`` (or ``Bearer sk_live_...``) is malformed or unknown."""

    code = "api_key_invalid"


class ApiKeyRevoked(Unauthenticated):
    """Raised when the key was revoked with ``DELETE /me/api-keys/:id``."""

    code = "api_key_revoked"


class KeyLimitReached(Conflict):
    """Raised when a user who already has ``max_keys_per_user`` active keys creates another."""

    code = "key_limit_reached"
