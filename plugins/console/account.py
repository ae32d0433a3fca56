"""The console's account page: the subscription (tier, status, renewal, features) with
checkout and cancel, and the on-chain balances per chain and the tree, from the existing
read endpoints (``/me/subscription``, ``/me/flow-onchain``, ``/me/tree``). A plugin that is
not enabled, or a chain that cannot be read, shows as the API's error for that part only."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response
from quart_schema import hide

from plugins.console.api import Answer, call
from plugins.console.security import check_csrf, page
from plugins.console.session import SIGN_IN, after_form, see_other, signed_in_user

blueprint = Blueprint("console_account", __name__, template_folder="templates")
ACCOUNT = "/console/account"
TIERS = ("plus", "pro", "max")
PROVIDERS = ("gateway", "crypto_bot", "usdt_bep20")


async def _account_page(*, status: int = 200, error: Answer | None = None,
                        checkout: dict[str, Any] | None = None) -> Response:
    user = await signed_in_user()
    if user is None:
        return see_other(SIGN_IN)
    subscription = await call("GET", "/me/subscription")
    onchain = await call("GET", "/me/flow-onchain")
    tree = await call("GET", "/me/tree") if onchain.ok else None
    return await page("account.html", status=status, user=user, error=error,
                      subscription=subscription, onchain=onchain, tree=tree,
                      checkout=checkout, tiers=TIERS, providers=PROVIDERS)


@blueprint.get(ACCOUNT)
@hide
async def account() -> Response:
    return await _account_page()


@blueprint.post(f"{ACCOUNT}/checkout")
@hide
async def checkout() -> Response:
    form = await check_csrf()
    answer = await call("POST", "/subscriptions/checkout",
                        body={"tier": form.get("tier", ""), "provider": form.get("provider", "")})
    if answer.ok:
        return await _account_page(status=201, checkout=answer.body)
    return after_form(answer, ACCOUNT) or await _account_page(status=answer.status,
                                                              error=answer)


@blueprint.post(f"{ACCOUNT}/cancel")
@hide
async def cancel() -> Response:
    await check_csrf()
    answer = await call("POST", "/me/subscription/cancel")
    return after_form(answer, ACCOUNT) or await _account_page(status=answer.status,
                                                              error=answer)
