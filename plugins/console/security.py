"""What every console page carries: a CSP with a per-request nonce, and CSRF on forms.

CSRF is a double-submit token: a random value in an HttpOnly, ``SameSite=Strict`` cookie
scoped to ``/console``, repeated in a hidden field of every form; a form whose field does not
equal the cookie (compared in constant time) is refused 403 ``csrf_refused`` before the API is
called. Another site can neither read the cookie nor make the browser send it.
"""

from __future__ import annotations

import secrets
from typing import Any

from quart import Response, render_template, request

from plugins.console.errors import CsrfRefused
from runtime.http import current_service

CSRF_COOKIE = "console_csrf"
CSRF_FIELD = "csrf"
_CSP = ("default-src 'none'; script-src 'nonce-{nonce}'; style-src 'self' 'nonce-{nonce}'; "
        "img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-src 'self' https:; "
        "frame-ancestors 'none'; base-uri 'none'")


def csrf_token() -> str:
    """The browser's CSRF token: its cookie's, or a new one (set by ``page``)."""
    return request.cookies.get(CSRF_COOKIE) or _new_token()


def _new_token() -> str:
    token: str | None = getattr(request, "_console_csrf", None)
    if token is None:
        token = secrets.token_urlsafe(32)
        request._console_csrf = token  # type: ignore[attr-defined]
    return token


async def check_csrf() -> dict[str, str]:
    """The submitted form, once its CSRF field matches the cookie.

    :raises CsrfRefused: no cookie, no field, or they differ.
    """
    form = await request.form
    cookie = request.cookies.get(CSRF_COOKIE, "")
    submitted = form.get(CSRF_FIELD, "")
    if not cookie or not secrets.compare_digest(cookie.encode(), submitted.encode()):
        raise CsrfRefused("the form's CSRF token is missing or wrong; reload the page")
    return {name: form.get(name, "") for name in form}


async def page(template: str, *, status: int = 200, no_store: bool = False,
               set_cookies: list[str] | None = None, **context: Any) -> Response:
    """``template`` rendered with a fresh CSP nonce and the CSRF token, with their headers.

    :param no_store: the page shows a secret: no cache may keep it.
    :param set_cookies: Set-Cookie lines of the API to pass on (a sign-in's session).
    """
    nonce = secrets.token_urlsafe(16)
    token = csrf_token()
    html = await render_template(template, csp_nonce=nonce, csrf_token=token, **context)
    response = Response(html, status=status, content_type="text/html; charset=utf-8")
    secure_headers(response, nonce, no_store=no_store)
    for line in set_cookies or []:
        response.headers.add("Set-Cookie", line)
    if request.cookies.get(CSRF_COOKIE) != token:
        response.set_cookie(CSRF_COOKIE, token, path="/console", httponly=True,
                            samesite="Strict",
                            secure=current_service().settings.service.cookie_secure)
    return response


def secure_headers(response: Response, nonce: str, *, no_store: bool = False) -> None:
    response.headers["Content-Security-Policy"] = _CSP.format(nonce=nonce)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["Cache-Control"] = "no-store" if no_store else "private, no-cache"
