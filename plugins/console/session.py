"""What every page view starts with: who is signed in, and the redirects a form answers."""

from __future__ import annotations

from typing import Any

from quart import Response

from plugins.console.api import Answer, call

SIGN_IN = "/console/sign-in"


def see_other(location: str, set_cookies: list[str] | None = None) -> Response:
    """A 303 to ``location`` (after a form), passing on the API's Set-Cookie lines."""
    response = Response("", status=303, headers={"Location": location})
    for line in set_cookies or []:
        response.headers.add("Set-Cookie", line)
    return response


async def signed_in_user() -> dict[str, Any] | None:
    """The caller's ``GET /me`` user, or None without a session."""
    me = await call("GET", "/me")
    user = me.body.get("user")
    return user if me.ok and isinstance(user, dict) else None


def after_form(answer: Answer, location: str) -> Response | None:
    """Where a form's API answer leads: the sign-in page on 401, ``location`` on success;
    None for an error the page should show."""
    if answer.status == 401:
        return see_other(SIGN_IN)
    return see_other(location) if answer.ok else None
