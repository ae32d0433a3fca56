"""The service's HTTP API, called in process on behalf of the browser's caller.

A console page is the answer of the same routes a client calls: ``call`` sends the request
through the app (the whole request pipeline: authentication, buckets, hooks, access log) with
the browser's session cookie and client address, and gives back the status, the JSON body
and the cookies the API set. No plugin's module is imported and no table is read here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from quart import current_app, request

from runtime.http import current_service
from runtime.principal import SESSION_COOKIE

FORWARDED_HEADERS = ("x-forwarded-for", "user-agent")


@dataclass(frozen=True)
class Answer:
    """An API answer: its status, its JSON body (``{}`` when empty) and its Set-Cookie lines."""

    status: int
    body: dict[str, Any]
    set_cookies: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status < 400

    @property
    def error_message(self) -> str:
        error = self.body.get("error")
        return str(error.get("message")) if isinstance(error, dict) else f"HTTP {self.status}"

    @property
    def error_code(self) -> str | None:
        error = self.body.get("error")
        return str(error.get("code")) if isinstance(error, dict) else None


async def call(method: str, path: str, *, body: dict[str, Any] | None = None,
               query: dict[str, str] | None = None, as_operator: bool = False) -> Answer:
    """``method path`` on the API as the current browser's caller.

    :param body: the JSON body, if any.
    :param query: query-string arguments.
    :param as_operator: with the internal token instead of the caller's session (what
        ``flowsvc dev-wallet`` does to register a development token; embedded default only).
    """
    headers = {name: value for name in FORWARDED_HEADERS
               if (value := request.headers.get(name)) is not None}
    session = request.cookies.get(SESSION_COOKIE)
    if as_operator:
        headers["authorization"] = f"Bearer {current_service().settings.internal.token}"
    elif session is not None:
        headers["cookie"] = f"{SESSION_COOKIE}={session}"
    client = current_app.test_client()
    response = await client.open(
        path, method=method, headers=headers, json=body, query_string=query,
        scope_base={"client": request.scope.get("client"), "scheme": request.scheme})
    data = await response.get_data()
    try:
        decoded = json.loads(data) if data else {}
    except ValueError:
        decoded = {}
    return Answer(response.status_code, decoded if isinstance(decoded, dict) else {},
                  response.headers.getlist("Set-Cookie"))


def page_query(default_limit: int) -> dict[str, str]:
    """``limit`` and ``cursor`` for a listing the API pages, from the page's own URL (a
    ``limit`` that is not 1 to 100 is the default; the API judges the cursor)."""
    limit = request.args.get("limit", "")
    chosen = limit if limit.isascii() and limit.isdigit() and 0 < int(limit) <= 100 \
        else str(default_limit)
    cursor = request.args.get("cursor", "")
    return {"limit": chosen, **({"cursor": cursor} if cursor else {})}
