"""The request context: what the runtime knows of the request being handled.

The HTTP pipeline makes one ``RequestContext`` per request and passes it to the request
hooks (``flowsvc_authenticate``, ``flowsvc_before_request``, ``flowsvc_after_request``);
routes reach it with ``current_context()``. A plugin keeps what it must carry from one
hook to the next in a slot of its own, under a ``RequestSlot`` key only it holds (pytest's
stash), instead of on Quart's ``g``::

    KEY_CALL: RequestSlot[KeyCall] = RequestSlot("keys.call")
    context.put(KEY_CALL, KeyCall(record))     # in flowsvc_authenticate
    call = context.get(KEY_CALL)               # in flowsvc_after_request (None if unset)
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Generic, TypeVar

from runtime.errors import Unauthenticated
from runtime.principal import Principal

T = TypeVar("T")
View = TypeVar("View", bound=Callable[..., Awaitable[Any]])


class RequestSlot(Generic[T]):
    """The typed key of one plugin's value in a request context."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"RequestSlot({self.name!r})"


class RequestContext:
    """One request, as the runtime and the plugins see it.

    :param request_id: the ``X-Request-Id`` of the response (a valid incoming one echoed).
    :param started: ``time.perf_counter()`` when the request began.
    :param client_ip: the client's address (see ``runtime.http.client_ip``).
    """

    __slots__ = ("request_id", "started", "client_ip", "principal", "idempotency", "_slots")

    def __init__(self, request_id: str, started: float, client_ip: str) -> None:
        self.request_id = request_id
        self.started = started
        self.client_ip = client_ip
        self.principal: Principal | None = None
        """The caller, once a ``flowsvc_authenticate`` hook named one; None: anonymous."""
        self.idempotency: tuple[str, str] | None = None
        """The ``(scope, key)`` this request claimed with ``Idempotency-Key``, if any."""
        self._slots: dict[RequestSlot[Any], Any] = {}

    def take_idempotency(self) -> tuple[str, str] | None:
        """Take over this request's ``Idempotency-Key`` claim: the pipeline will not store
        the response, the caller completes the claim itself (with a replay that leaves a
        secret out, in the transaction of the change: ``idempotency.complete``)."""
        claimed, self.idempotency = self.idempotency, None
        return claimed

    def put(self, slot: RequestSlot[T], value: T) -> None:
        """Keep ``value`` under ``slot`` for the rest of the request."""
        self._slots[slot] = value

    def get(self, slot: RequestSlot[T]) -> T | None:
        """The value kept under ``slot``, or None."""
        value: T | None = self._slots.get(slot)
        return value

    def pop(self, slot: RequestSlot[T]) -> T | None:
        """Take the value kept under ``slot`` away (None when there was none)."""
        value: T | None = self._slots.pop(slot, None)
        return value


# Each request runs in a Trio task of its own (quart-trio spawns one per request), and the
# pipeline, the route, the error handlers and the response body all run in it: a context
# variable holds its context, cheaper to read than Quart's ``g`` through werkzeug's proxy.
_CURRENT: ContextVar[RequestContext | None] = ContextVar("flowsvc_request_context",
                                                         default=None)


def bind_context(context: RequestContext) -> None:
    """Make ``context`` the current request's (the HTTP pipeline calls it first)."""
    _CURRENT.set(context)


def find_context() -> RequestContext | None:
    """The context of the request being handled, or None before the pipeline made one."""
    return _CURRENT.get()


def current_context() -> RequestContext:
    """The context of the request being handled.

    :raises RuntimeError: outside a request handled by the flowsvc pipeline.
    """
    context = find_context()
    if context is None:
        raise RuntimeError("no flowsvc request context: not inside a request")
    return context


def current_principal() -> Principal | None:
    """The caller of the request being handled, or None when anonymous."""
    context = find_context()
    return context.principal if context is not None else None


def require_user() -> Principal:
    """The caller of the request being handled.

    :raises Unauthenticated: the request carries no valid session, bearer token or key.
    """
    principal = current_principal()
    if principal is None or principal.via == "internal":
        raise Unauthenticated("sign in or send an API key to use this endpoint")
    return principal


def require_internal() -> Principal:
    """The internal caller (operators' tooling, other services).

    :raises Unauthenticated: the request does not carry the internal token.
    """
    principal = current_principal()
    if principal is None or principal.via != "internal":
        raise Unauthenticated("this endpoint needs the internal token")
    return principal


def caller_first(check: Callable[[], object]) -> Callable[[View], View]:
    """Run ``check`` (``require_user``, ``require_internal``) before the view and before
    its body is validated: a caller without credentials learns that first (401), not
    what is wrong with a body it may not send anyway. Put it above ``validate_request``."""

    def decorate(view: View) -> View:
        @functools.wraps(view)
        async def checked(*args: Any, **kwargs: Any) -> Any:
            check()
            return await view(*args, **kwargs)

        return checked  # type: ignore[return-value]

    return decorate
