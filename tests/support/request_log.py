"""A test plugin that records every request the service answered: what was asked, whether it
carried a ``Cookie`` header, and who the caller was.

Enabled by its module path (``"tests.support.request_log"`` in ``[plugins] enabled``); the
record is per service: ``service.state(REQUEST_LOG)``.
"""

from __future__ import annotations

from dataclasses import dataclass

from quart import Request, Response

from runtime.context import RequestContext
from runtime.hookspecs import hookimpl
from runtime.service import Service, StateSlot

MODULE = "tests.support.request_log"


@dataclass(frozen=True)
class Seen:
    """One answered request: its path and query, its Cookie header's presence, its caller."""

    target: str
    had_cookie: bool
    user_id: int | None


REQUEST_LOG: StateSlot[list[Seen]] = StateSlot("request-log", lambda service: [])


@hookimpl
def flowsvc_after_request(service: Service, request: Request, response: Response,
                          context: RequestContext) -> None:
    query = request.query_string.decode("ascii", "replace")
    principal = context.principal
    service.state(REQUEST_LOG).append(Seen(
        request.path + (f"?{query}" if query else ""), "cookie" in request.headers,
        principal.user_id if principal is not None else None))
