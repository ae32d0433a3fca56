"""The development wallet in the console, on the embedded default only (SQLite, no Redis, not
production): sign in with it, and register a development token it owns, in one click each.

It is the wallet of ``flowsvc dev-wallet``: the same key file, ``<var_dir>/dev-wallet.key``
(created on first use, mode 0600), so the console and the README's "Try it" lines are one
user. The sign-in is the browser wallet's SIWE exchange (``POST /auth/nonce``, a signature,
``POST /auth/verify``), done here with the key; the token is registered with the internal
token through ``PUT /internal/tokens/<slug>``, as the command does. Anywhere else both
answer 404 and the sign-in page offers neither.
"""

from __future__ import annotations

import trio
from eth_account import Account
from eth_account.messages import encode_defunct
from quart import Blueprint, Response
from quart_schema import hide

from plugins.console.api import call
from plugins.console.deployment import dev_wallet_available
from plugins.console.projects import index_page
from plugins.console.security import check_csrf
from plugins.console.session import SIGN_IN, after_form, see_other, signed_in_user
from runtime.dev_wallet import DEV_TEMPLATE, KEY_FILE, placeholder_instance, wallet_key
from runtime.errors import NotFound
from runtime.http import current_service

blueprint = Blueprint("console_dev_wallet", __name__)
DEV_CHAIN_ID = 56


def _check_available() -> None:
    if not dev_wallet_available():
        raise NotFound("the development wallet is only for the embedded default")


def _signature(key: str, message: str) -> str:
    signed = Account.sign_message(encode_defunct(text=message), private_key=key)
    signature: bytes = signed.signature
    return "0x" + signature.hex().removeprefix("0x")


@blueprint.post("/console/sign-in/dev-wallet")
@hide
async def sign_in() -> Response:
    await check_csrf()
    _check_available()
    key = await trio.to_thread.run_sync(
        wallet_key, current_service().settings.service.var_dir / KEY_FILE)
    address = Account.from_key(key).address.lower()
    issued = await call("POST", "/auth/nonce", body={"address": address})
    if not issued.ok:
        return after_form(issued, SIGN_IN) or see_other(SIGN_IN)
    message = str(issued.body["message"])
    signature = await trio.to_thread.run_sync(_signature, key, message)
    verified = await call("POST", "/auth/verify", body={
        "address": address, "message": message, "signature": signature})
    return see_other("/console/projects" if verified.ok else SIGN_IN, verified.set_cookies)


@blueprint.post("/console/projects/dev-token")
@hide
async def register_token() -> Response:
    form = await check_csrf()
    _check_available()
    user = await signed_in_user()
    if user is None or not user.get("address"):
        return see_other(SIGN_IN)
    slug = form.get("slug", "").strip()
    answer = await call("PUT", f"/internal/tokens/{slug}", as_operator=True, body={
        "ownerAddress": user["address"], "template": DEV_TEMPLATE, "chainId": DEV_CHAIN_ID,
        "instance": placeholder_instance(slug)})
    return after_form(answer, f"/console/projects?token={slug}") or await index_page(
        status=answer.status, error=answer, form={"tokenSlug": slug})
