"""The one error hierarchy of flowsvc.

Every error a client can see is a ``ServiceError`` subclass with an HTTP status and a
stable snake_case ``code``; the HTTP front end renders it as
``{"error": {"code", "message"}}``. Plugins subclass these (or ``ServiceError``
directly) for their own codes; ``docs/errors.md`` lists every code.
"""

from __future__ import annotations

from typing import Any, ClassVar


class ServiceError(Exception):
    """Base of every error answered to a client.

    :param message: a sentence for humans; never contains a secret.
    :param details: optional structured details (``invalid_request`` uses a list of
        ``{field, message}``).
    :param headers: extra response headers (``Retry-After`` for 429).
    """

    status: ClassVar[int] = 500
    code: ClassVar[str] = "internal"

    def __init__(
        self,
        message: str,
        *,
        details: list[dict[str, Any]] | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.details = details
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        """The JSON body of the error response."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.details is not None:
            error["details"] = self.details
        return {"error": error}


class InvalidRequest(ServiceError):
    """Raised when input fails validation; ``details`` names each bad field."""

    status = 400
    code = "invalid_request"


class Unauthenticated(ServiceError):
    """Raised when a route needs a caller and no valid credential came with the request."""

    status = 401
    code = "unauthenticated"


class Forbidden(ServiceError):
    """Raised when a valid caller lacks the right to do this."""

    status = 403
    code = "forbidden"


class NotFound(ServiceError):
    """Raised for what does not exist or may not be seen by this caller."""

    status = 404
    code = "not_found"


class MethodNotAllowed(ServiceError):
    """Raised when the path exists but not with this method."""

    status = 405
    code = "method_not_allowed"


class Conflict(ServiceError):
    """Raised when the request conflicts with the current state of a resource."""

    status = 409
    code = "conflict"


class PayloadTooLarge(ServiceError):
    """Raised when the request body is over ``service.max_body_bytes``."""

    status = 413
    code = "payload_too_large"


class RequestTimeout(ServiceError):
    """Raised when the request body has not fully arrived within
    ``service.body_timeout_seconds``; the connection is closed after the answer."""

    status = 408
    code = "request_timeout"


class UnsupportedMediaType(ServiceError):
    """Raised when a JSON route gets a body whose ``Content-Type`` is not JSON."""

    status = 415
    code = "unsupported_media_type"


class IdempotencyKeyReused(ServiceError):
    """Raised when an ``Idempotency-Key`` is repeated with a different request."""

    status = 422
    code = "idempotency_key_reused"


class IdempotencyInProgress(ServiceError):
    """Raised when an ``Idempotency-Key`` is repeated while its first request still runs."""

    status = 409
    code = "idempotency_in_progress"


class RateLimited(ServiceError):
    """Raised when a request bucket is empty; carries ``Retry-After`` in whole seconds."""

    status = 429
    code = "rate_limited"

    def __init__(self, message: str, *, retry_after: int, headers: dict[str, str] | None = None):
        super().__init__(message, headers={**(headers or {}), "Retry-After": str(retry_after)})
        self.retry_after = retry_after


class SpendCapReached(ServiceError):
    """Raised when an API key's ``spend_period_used`` has reached ``spend_limit_flow``."""

    status = 402
    code = "spend_cap_reached"


UNAVAILABLE_RETRY_AFTER_SECONDS = 5
"""The ``Retry-After`` of every 503: about how long a client should wait before retrying."""


class Unavailable(ServiceError):
    """Raised when a dependency (database, Redis, chain RPC, an actor) cannot answer, or does
    not answer within its deadline; carries ``Retry-After``
    (``UNAVAILABLE_RETRY_AFTER_SECONDS`` unless ``headers`` says otherwise)."""

    status = 503
    code = "unavailable"

    def __init__(self, message: str, *, details: list[dict[str, Any]] | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message, details=details, headers={
            "Retry-After": str(UNAVAILABLE_RETRY_AFTER_SECONDS), **(headers or {})})


class Draining(Unavailable):
    """Raised by a process that is shutting down (``runtime.drain``): ``/readyz``, and work
    it no longer starts, such as a new agent run. Another process takes the retry."""

    code = "draining"


class InternalError(ServiceError):
    """Answered for any unexpected exception; the cause is logged, never sent."""

    status = 500
    code = "internal"


def is_outage(error: BaseException) -> bool:
    """Whether ``error`` says a dependency is down, rather than that the code is wrong.

    An actor waits out an outage (database, Redis, a chain RPC, a payment provider) with
    backoff (``runtime.backoff``) and carries on; any other exception is a bug that crashes
    it, for the supervisor to restart within its intensity. What counts as an outage:

    - ``Unavailable``: ``Database`` turns a refused, reset or administratively shut down
      connection (psycopg's ``OperationalError``) into it, ``SharedState.ping`` a dead
      Redis, an actor address a silent actor, the chain plugin an RPC pool with no healthy
      endpoint;
    - a socket error (``OSError``: refused, reset, unreachable, ``TimeoutError``) or a
      deadline (``trio.TooSlowError``) from any client;
    - Redis saying it cannot serve now: a lost or refused connection (``ConnectionError``,
      which includes a server still loading its data), a read-only replica during a
      failover, a cluster that is down or asks to try again;
    - an exception group (a nursery of the caller's own) whose every member is one.

    Everything else is a bug, Redis' own included: a wrong type, a script error, a
    command syntax error would fail again on the next try.
    """
    if isinstance(error, BaseExceptionGroup):
        return bool(error.exceptions) and all(is_outage(inner) for inner in error.exceptions)
    import trio
    from coredis.exceptions import (
        ClusterDownError,
        ConnectionError,
        PrimaryNotFoundError,
        ReadOnlyError,
        TryAgainError,
    )

    return isinstance(error, Unavailable | OSError | trio.TooSlowError | ConnectionError
                      | ReadOnlyError | ClusterDownError | TryAgainError | PrimaryNotFoundError)
