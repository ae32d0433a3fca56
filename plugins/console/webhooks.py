"""The console's webhooks pages: endpoints and their events, the signing secret shown on the
answer to a create or a rotation only (``no-store``), deliveries with their attempts filtered
by state and event type by the API, a page at a time, resend one, recover failed since a
time, a test event, and the event catalogue. Everything goes through ``/me/webhooks``."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quart import Blueprint, Response, request
from quart_schema import hide

from plugins.console.api import Answer, call, page_query
from plugins.console.security import check_csrf, page
from plugins.console.session import SIGN_IN, after_form, see_other, signed_in_user

blueprint = Blueprint("console_webhooks", __name__, template_folder="templates")
WEBHOOKS = "/console/webhooks"
STATES = ("pending", "delivered", "failed")
DELIVERIES_PAGE = 50  # ?limit= in the URL changes it


async def _list_page(*, status: int = 200, error: Answer | None = None,
                     revealed: dict[str, Any] | None = None) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    listed = await call("GET", "/me/webhooks")
    catalogue = await call("GET", "/me/webhooks/events")
    return await page("webhooks.html", status=status, no_store=revealed is not None, user=user,
                      webhooks=listed.body.get("webhooks", []),
                      catalogue=catalogue.body.get("events", []), revealed=revealed,
                      error=error or next((a for a in (listed, catalogue) if not a.ok), None))


@blueprint.get(WEBHOOKS)
@hide
async def webhooks() -> Response:
    return await _list_page()


@blueprint.post(WEBHOOKS)
@hide
async def create_webhook() -> Response:
    await check_csrf()
    form = await request.form
    answer = await call("POST", "/me/webhooks", body={"url": form.get("url", ""),
                                                      "events": form.getlist("events")})
    if answer.status == 401:
        return see_other(SIGN_IN)
    if not answer.ok:
        return await _list_page(status=answer.status, error=answer)
    return await _list_page(status=201, revealed=answer.body.get("webhook"))


async def _detail_page(webhook_id: int, *, status: int = 200, error: Answer | None = None,
                       revealed: dict[str, Any] | None = None,
                       notice: str | None = None) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    shown = await call("GET", f"/me/webhooks/{webhook_id}")
    if not shown.ok:
        return await page("webhooks.html", status=shown.status, user=user, webhooks=[],
                          catalogue=[], revealed=None, error=shown)
    state = request.args.get("state", "")
    state = state if state in STATES else ""
    filters = {name: value for name, value in (("state", state),
                                               ("event", request.args.get("event", "")))
               if value}
    paging = page_query(DELIVERIES_PAGE)
    listed = await call("GET", f"/me/webhooks/{webhook_id}/deliveries",
                        query={**filters, **paging})
    catalogue = await call("GET", "/me/webhooks/events")
    return await page("webhook.html", status=status, no_store=revealed is not None, user=user,
                      webhook=shown.body["webhook"],
                      deliveries=listed.body.get("deliveries", []), states=STATES,
                      state=state, event=filters.get("event", ""),
                      older={**filters, "limit": paging["limit"]},
                      next_cursor=listed.body.get("nextCursor"),
                      catalogue=catalogue.body.get("events", []),
                      revealed=revealed, notice=notice,
                      error=error or (None if listed.ok else listed))


@blueprint.get(f"{WEBHOOKS}/<int:webhook_id>")
@hide
async def webhook(webhook_id: int) -> Response:
    return await _detail_page(webhook_id)


@blueprint.post(f"{WEBHOOKS}/<int:webhook_id>/rotate-secret")
@hide
async def rotate_secret(webhook_id: int) -> Response:
    await check_csrf()
    answer = await call("POST", f"/me/webhooks/{webhook_id}/rotate-secret")
    if answer.status == 401:
        return see_other(SIGN_IN)
    if not answer.ok:
        return await _detail_page(webhook_id, status=answer.status, error=answer)
    return await _detail_page(webhook_id, revealed=answer.body.get("webhook"))


async def _scheduled(webhook_id: int, path: str, body: dict[str, Any] | None = None
                     ) -> Response:
    answer = await call("POST", f"/me/webhooks/{webhook_id}{path}", body=body)
    return after_form(answer, f"{WEBHOOKS}/{webhook_id}") or await _detail_page(
        webhook_id, status=answer.status, error=answer)


@blueprint.post(f"{WEBHOOKS}/<int:webhook_id>/test")
@hide
async def send_test(webhook_id: int) -> Response:
    await check_csrf()
    return await _scheduled(webhook_id, "/test")


@blueprint.post(f"{WEBHOOKS}/<int:webhook_id>/deliveries/<event_id>/redeliver")
@hide
async def resend(webhook_id: int, event_id: str) -> Response:
    await check_csrf()
    return await _scheduled(webhook_id, f"/deliveries/{event_id}/redeliver")


def _utc(value: str) -> str:
    """A ``datetime-local`` value (no zone) read as UTC, in ISO 8601; anything else as is,
    for the API to refuse."""
    try:
        return datetime.fromisoformat(value).replace(tzinfo=UTC).isoformat()
    except ValueError:
        return value


@blueprint.post(f"{WEBHOOKS}/<int:webhook_id>/recover")
@hide
async def recover(webhook_id: int) -> Response:
    form = await check_csrf()
    return await _scheduled(webhook_id, "/recover", {"since": _utc(form.get("since", ""))})


@blueprint.post(f"{WEBHOOKS}/<int:webhook_id>/delete")
@hide
async def delete(webhook_id: int) -> Response:
    await check_csrf()
    answer = await call("DELETE", f"/me/webhooks/{webhook_id}")
    return after_form(answer, WEBHOOKS) or await _detail_page(webhook_id, status=answer.status,
                                                              error=answer)
