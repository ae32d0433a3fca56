"""The console's pages: sign-in and sign-out, and API keys (docs/console.md).

Every view calls the HTTP API through ``plugins.console.api`` as the browser's caller and
renders the answer; an API error is shown on the page with its code and status. A page that
needs a session sends the browser to the sign-in page when the API answers 401.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request
from quart_schema import hide

from plugins.console.activity import WINDOWS
from plugins.console.api import Answer, call
from plugins.console.deployment import dev_wallet_available
from plugins.console.security import check_csrf, page
from plugins.console.session import SIGN_IN, after_form, see_other, signed_in_user

blueprint = Blueprint("console", __name__, template_folder="templates",
                      static_folder="static", static_url_path="/console/static")
KEYS = "/console/keys"
KEY_FIELDS = ("name", "rate_limit_rpm", "spend_limit_flow", "spend_period")


@blueprint.get("/")
@hide
async def root() -> Response:
    return see_other("/console/")


@blueprint.get("/console/")
@hide
async def home() -> Response:
    return see_other(KEYS if await signed_in_user() is not None else SIGN_IN)


@blueprint.get(SIGN_IN)
@hide
async def sign_in() -> Response:
    return await page("sign_in.html", user=await signed_in_user(), error=None,
                      dev_wallet=dev_wallet_available())


@blueprint.post("/console/sign-in/access-code")
@hide
async def sign_in_with_code() -> Response:
    form = await check_csrf()
    answer = await call("POST", "/auth/access-code", body={"code": form.get("code", "")})
    if answer.ok:
        return see_other(KEYS, answer.set_cookies)
    return await page("sign_in.html", status=answer.status, user=None, error=answer,
                      dev_wallet=dev_wallet_available())


@blueprint.post("/console/sign-out")
@hide
async def sign_out() -> Response:
    await check_csrf()
    answer = await call("POST", "/auth/logout")
    return see_other(SIGN_IN, answer.set_cookies)


async def _keys_page(*, status: int = 200, error: Answer | None = None,
                     created: dict[str, Any] | None = None,
                     previous: dict[str, Any] | None = None) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    window = _window()
    listed = await call("GET", "/me/api-keys", query={"limit": "100"})
    stats = await call("GET", "/me/api-keys/stats", query={"window": window})
    counts = {entry["key_id"]: entry for entry in stats.body.get("keys", [])}
    failed = next((answer for answer in (listed, stats) if not answer.ok), None)
    return await page("keys.html", status=status, no_store=created is not None, user=user,
                      keys=listed.body.get("keys", []), counts=counts, window=window,
                      windows=WINDOWS, error=error or failed, created=created,
                      previous=previous)


def _window() -> str:
    chosen = request.args.get("window", "day")
    return chosen if chosen in WINDOWS else "day"


@blueprint.get(KEYS)
@hide
async def keys() -> Response:
    return await _keys_page()


def _key_body(form: dict[str, str]) -> dict[str, Any]:
    """The API body of a key form: blank fields are left out; a blank spend limit in an edit
    is no cap."""
    body: dict[str, Any] = {}
    for name in KEY_FIELDS:
        value = form.get(name, "").strip()
        if name == "rate_limit_rpm" and value:
            body[name] = int(value) if value.isdigit() else value
        elif value:
            body[name] = value
    return body


@blueprint.post(KEYS)
@hide
async def create_key() -> Response:
    """The answer to the create is the only page that shows the raw key (``no-store``)."""
    form = await check_csrf()
    answer = await call("POST", "/me/api-keys", body=_key_body(form))
    if answer.status == 401:
        return see_other(SIGN_IN)
    if not answer.ok:
        return await _keys_page(status=answer.status, error=answer)
    return await _keys_page(status=201, created=answer.body.get("key"))


@blueprint.post(f"{KEYS}/<int:key_id>/limits")
@hide
async def edit_key(key_id: int) -> Response:
    form = await check_csrf()
    body = _key_body(form)
    if not form.get("spend_limit_flow", "").strip():
        body["spend_limit_flow"] = None
    answer = await call("PATCH", f"/me/api-keys/{key_id}", body=body)
    return await _after_change(answer)


@blueprint.post(f"{KEYS}/<int:key_id>/rotate")
@hide
async def rotate_key(key_id: int) -> Response:
    """Like the create, the answer is the only page showing the new raw key."""
    form = await check_csrf()
    overlap = form.get("overlap_seconds", "0")
    answer = await call("POST", f"/me/api-keys/{key_id}/rotate",
                        body={"overlap_seconds": int(overlap) if overlap.isdigit() else overlap})
    if answer.status == 401:
        return see_other(SIGN_IN)
    if not answer.ok:
        return await _keys_page(status=answer.status, error=answer)
    return await _keys_page(status=201, created=answer.body.get("key"),
                            previous=answer.body.get("previous"))


@blueprint.post(f"{KEYS}/<int:key_id>/revoke")
@hide
async def revoke_key(key_id: int) -> Response:
    await check_csrf()
    return await _after_change(await call("DELETE", f"/me/api-keys/{key_id}"))


async def _after_change(answer: Answer) -> Response:
    return after_form(answer, KEYS) or await _keys_page(status=answer.status, error=answer)
