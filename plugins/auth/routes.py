"""Routes of the auth plugin: /auth/* and /me (shapes and errors in docs/auth.md).

Views are module-level functions on ``blueprint``; they find the service with
``current_service()`` and the plugin's state with ``service.state(AUTH)``.
"""

from __future__ import annotations

import trio
from pydantic import BaseModel, ConfigDict, Field
from quart import Blueprint, Response
from quart_schema import document_response, validate_request
from sqlalchemy import Connection, insert

from plugins.auth.identities import consume_nonce, link_messenger, redeem_access_code
from plugins.auth.messenger import validate_init_data
from plugins.auth.session_view import announce_revoked, announce_user_changed, offer_user
from plugins.auth.sessions import (
    SessionClaims,
    clear_session_cookie,
    issue_token,
    revoke_session,
    set_session_cookie,
    start_session,
)
from plugins.auth.siwe import SiweParams, build_message, expiry, new_nonce, nonce_of, recover_signer
from plugins.auth.state import AUTH, ROTATION, SESSION
from plugins.auth.tables import nonces
from runtime.context import current_context, current_principal, require_user
from runtime.errors import InvalidRequest, Unauthenticated
from runtime.http import current_service, json_response
from runtime.inputs import Body
from runtime.openapi import Success, answers
from runtime.service import Service
from runtime.users import User, get_user
from runtime.wire import iso, utcnow

ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"


class NonceRequest(Body):
    model_config = ConfigDict(json_schema_extra={
        "examples": [{"address": "0x52908400098527886e0f7030069857d2e4169ee7"}]})
    address: str = Field(pattern=ADDRESS_PATTERN, description="EVM address, 0x-prefixed")


class NonceResponse(BaseModel):
    nonce: str
    message: str
    expiresAt: str


class VerifyRequest(Body):
    address: str = Field(pattern=ADDRESS_PATTERN)
    message: str = Field(min_length=1, max_length=4096)
    # Any hex is accepted here: one that is not a 65-byte signature of the message by
    # the address is answered signature_invalid (401), like a wrong signer.
    signature: str = Field(pattern=r"^(0x)?[0-9a-fA-F]+$", max_length=1024)


class MessengerRequest(Body):
    initData: str = Field(min_length=1, max_length=8192)


class AccessCodeRequest(Body):
    model_config = ConfigDict(json_schema_extra={"examples": [{"code": "WELCOME-7QX4"}]})
    code: str = Field(min_length=1, max_length=128)


class MessengerBody(BaseModel):
    id: str
    username: str | None
    firstName: str | None
    lastName: str | None


class UserBody(BaseModel):
    id: str
    address: str | None
    displayName: str
    messenger: MessengerBody | None = None


class UserResponse(BaseModel):
    user: UserBody


def siwe_params(service: Service) -> SiweParams:
    settings = service.state(AUTH).settings
    public_url = service.settings.service.public_url
    domain = settings.siwe_domain or public_url.split("://", 1)[-1].rstrip("/")
    return SiweParams(domain=domain, uri=settings.siwe_uri or public_url,
                      chain_id=settings.siwe_chain_id, statement=settings.siwe_statement)


def _signed_in(service: Service, user: User, claims: SessionClaims) -> Response:
    """The sign-in response: the user, and the cookie of the new session."""
    token = issue_token(service.settings.jwt.secret, claims)
    response = json_response({"user": user.public()})
    set_session_cookie(response, service, token, claims.expires_at - claims.issued_at)
    # A cookie the caller came with must not be rotated into this response: its second
    # Set-Cookie would replace the new session's in the browser.
    current_context().pop(ROTATION)
    return response


def _caller_id() -> int | None:
    """The signed-in user making a sign-in request (to link to), if any."""
    principal = current_principal()
    return principal.user_id if principal is not None and principal.via != "internal" else None


blueprint = Blueprint("auth", __name__)


@blueprint.post("/auth/nonce")
@validate_request(NonceRequest)
@document_response(NonceResponse, 200)
async def nonce(data: NonceRequest) -> Response:
    """Issue a single-use SIWE nonce and the exact message to sign."""
    service = current_service()
    address = data.address.lower()
    issued = utcnow()
    expires = expiry(issued, service.state(AUTH).settings.nonce_ttl_seconds)
    value = new_nonce()
    message = build_message(siwe_params(service), address, value, issued, expires)
    await service.db.write(lambda c: c.execute(insert(nonces).values(
        nonce=value, address=address, message=message, issued_at=issued, expires_at=expires)))
    return json_response({"nonce": value, "message": message, "expiresAt": iso(expires)})


@blueprint.post("/auth/verify")
@validate_request(VerifyRequest)
@document_response(UserResponse, 200)
async def verify(data: VerifyRequest) -> Response:
    """Verify a signed SIWE message; sets the session cookie."""
    service = current_service()
    days = service.settings.jwt.session_days
    address = data.address.lower()
    nonce_value = nonce_of(data.message)
    if nonce_value is None:
        raise InvalidRequest("message is not a SIWE message issued by this service",
                             details=[{"field": "message", "message": "no nonce line"}])
    # Recovery is milliseconds of CPU: done before the transaction, off the event loop.
    signer = await trio.to_thread.run_sync(recover_signer, data.message, data.signature)

    def consume(connection: Connection) -> tuple[User, SessionClaims]:
        user = consume_nonce(connection, nonce_value, address, data.message, signer)
        return user, start_session(connection, user.id, address, "siwe", days)

    user, claims = await service.db.write(consume)
    return _signed_in(service, user, claims)


@blueprint.post("/auth/messenger")
@validate_request(MessengerRequest)
@document_response(UserResponse, 200)
async def messenger(data: MessengerRequest) -> Response:
    """Sign in with the messaging platform's WebApp initData (used by the bot)."""
    service = current_service()
    days = service.settings.jwt.session_days
    settings = service.state(AUTH).settings
    identity = validate_init_data(data.initData, settings.bot_token,
                                  settings.messenger_max_age_seconds)
    current_id = _caller_id()

    def link(connection: Connection) -> tuple[User, bool, SessionClaims]:
        user, changed = link_messenger(connection, identity, current_id)
        claims = start_session(connection, user.id, user.address, "messenger", days)
        return user, changed, claims

    user, changed, claims = await service.db.write(link)
    if changed:
        await announce_user_changed(service, user.id)
    return _signed_in(service, user, claims)


@blueprint.post("/auth/access-code")
@validate_request(AccessCodeRequest)
@document_response(UserResponse, 200)
async def access_code(data: AccessCodeRequest) -> Response:
    """Sign in (or up) with a single-use access code."""
    service = current_service()
    days = service.settings.jwt.session_days
    current_id = _caller_id()

    def redeem(connection: Connection) -> tuple[User, SessionClaims]:
        user = redeem_access_code(connection, data.code, current_id)
        return user, start_session(connection, user.id, user.address, "access_code", days)

    user, claims = await service.db.write(redeem)
    return _signed_in(service, user, claims)


@blueprint.post("/auth/logout")
@answers(Success(204))
async def logout() -> Response:
    """Revoke the current session everywhere and clear the cookie (204)."""
    service = current_service()
    principal = require_user()
    context = current_context()
    claims = context.get(SESSION)
    if principal.via != "session" or claims is None:
        raise Unauthenticated("logout needs a session, not an API key")
    stored_expiry = await service.db.write(revoke_session, claims.session_id)
    await announce_revoked(service, claims.session_id, max(stored_expiry or 0, claims.expires_at))
    response = Response("", status=204)
    clear_session_cookie(response, service)
    context.pop(ROTATION)
    return response


@blueprint.get("/me")
@document_response(UserResponse, 200)
async def me() -> Response:
    """The signed-in user, from this process's cache when fresh (see docs/auth.md)."""
    service = current_service()
    principal = require_user()
    view = service.state(AUTH).view
    body = view.cached_user(principal.user_id)
    if body is None:
        epoch = view.epoch  # taken before the read: a change during it voids the fill
        user = await service.db.read(get_user, principal.user_id)
        if user is None:
            raise Unauthenticated("the user of this session no longer exists")
        body = user.public()
        offer_user(service, user.id, body, epoch)
    return json_response({"user": body})
