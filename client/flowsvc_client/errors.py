"""Typed errors: every 4xx and 5xx answer of flowsvc becomes an ``ApiError`` subclass.

The service answers errors as ``{"error": {"code", "message", "details"?}}`` with a stable
``code`` (docs/errors.md lists them all); the class says the HTTP status, ``code`` says
exactly what went wrong, so callers branch on either::

    try:
        flow.create_project(...)
    except Forbidden as error:
        if error.code == "token_no_match": ...
"""

from __future__ import annotations

from typing import Any


class FlowsvcError(Exception):
    """Every error this package raises."""


class ApiError(FlowsvcError):
    """The service answered with an error status.

    :param status: the HTTP status.
    :param code: the stable error code (``token_no_match``, ``rate_limited``...).
    :param message: the service's human-readable message.
    :param details: ``error.details`` when given (``invalid_request``: ``{field, message}``).
    :param request_id: the ``X-Request-Id`` of the answer, to quote in a bug report.
    """

    def __init__(self, status: int, code: str, message: str, *,
                 details: list[dict[str, Any]] | None = None,
                 request_id: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        self.request_id = request_id


class BadRequest(ApiError):
    """400: invalid input (``invalid_request``, ``template_unknown``, ``tool_unknown``...)."""


class Unauthenticated(ApiError):
    """401: no valid credential (``unauthenticated``, ``api_key_revoked``, ``nonce_expired``...)."""


class SpendCapReached(ApiError):
    """402 ``spend_cap_reached``: the API key's spend cap for its period is reached."""


class Forbidden(ApiError):
    """403: a valid caller without the right (``token_no_match``, ``not_owner``...)."""


class NotFound(ApiError):
    """404: it does not exist, or the caller may not see it."""


class Conflict(ApiError):
    """409: a state conflict (``project_locked``, ``nonce_used``, ``conflict``...)."""


class RateLimited(ApiError):
    """429 ``rate_limited``, still refused after the client's own retries.

    :param retry_after: the seconds the service asked to wait (``Retry-After``).
    """

    def __init__(self, status: int, code: str, message: str, *,
                 details: list[dict[str, Any]] | None = None,
                 request_id: str | None = None, retry_after: float = 0.0) -> None:
        super().__init__(status, code, message, details=details, request_id=request_id)
        self.retry_after = retry_after


class ServerError(ApiError):
    """5xx: ``unavailable`` (a dependency is down; try later) or ``internal``."""


class WebhookSignatureError(FlowsvcError):
    """A webhook delivery failed verification; ``reason`` is ``"malformed"``,
    ``"no_matching_signature"`` or ``"timestamp_out_of_tolerance"``."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequest, 401: Unauthenticated, 402: SpendCapReached, 403: Forbidden,
    404: NotFound, 409: Conflict, 429: RateLimited,
}


def error_class(status: int) -> type[ApiError]:
    """The class of an error answer with ``status`` (``ApiError`` for the unlisted 4xx)."""
    if status >= 500:
        return ServerError
    return _BY_STATUS.get(status, ApiError)
