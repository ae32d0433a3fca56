"""Error codes of the auth plugin (the spec's Auth group)."""

from runtime.errors import Conflict, ServiceError, Unauthenticated


class NonceExpired(Unauthenticated):
    """Raised when the SIWE nonce is older than 5 minutes or unknown (expired ones are purged)."""

    code = "nonce_expired"


class NonceUsed(Conflict):
    """Raised when the SIWE nonce was already verified once."""

    code = "nonce_used"


class SignatureInvalid(Unauthenticated):
    """Raised when the signature does not recover to the address of the message."""

    code = "signature_invalid"


class TelegramInvalid(Unauthenticated):
    """Raised when the messaging-platform initData hash does not match or is missing, the data
    is stale or has no valid user, or no bot token is configured."""

    code = "telegram_invalid"


class CodeInvalid(Unauthenticated):
    """Raised when the access code is unknown or already used."""

    code = "code_invalid"


class MessengerLinked(ServiceError):
    """Raised when a messaging identity is already linked to another user."""

    status = 409
    code = "messenger_linked"
