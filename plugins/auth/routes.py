"""Routes of the auth plugin: /auth/* and /me."""

from __future__ import annotations

import hashlib
from datetime import timedelta
from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response, g
from quart_schema import document_response, validate_request
from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.auth.errors import (
    CodeInvalid,
    MessengerLinked,
    NonceExpired,
    NonceUsed,
    SignatureInvalid,
)
from plugins.auth.messenger import MessengerIdentity, validate_init_data
from plugins.auth.sessions import (
    REVOCATIONS_ACTOR,
    REVOKED_CHANNEL,
    SessionClaims,
    clear_session_cookie,
    issue_token,
    revoke_session,
    set_session_cookie,
    start_session,
)
from plugins.auth.settings import AuthSettings
from plugins.auth.siwe import SiweParams, build_message, expiry, new_nonce, nonce_of, recover_signer
from plugins.auth.tables import access_codes, nonces
from runtime.errors import InvalidRequest, NotFound, Unauthenticated
from runtime.http import json_response
from runtime.principal import require_user
from runtime.service import Service
from runtime.users import User, create_user, find_user, get_user
from runtime.wire import as_utc, iso, utcnow

ADDRESS_PATTERN = r"^0x[0-9a-fA-F]{40}$"


class NonceRequest(BaseModel):
    address: str = Field(pattern=ADDRESS_PATTERN, description="EVM address, 0x-prefixed")


class NonceResponse(BaseModel):
    nonce: str
    message: str
    expiresAt: str


class VerifyRequest(BaseModel):
    address: str = Field(pattern=ADDRESS_PATTERN)
    message: str = Field(min_length=1, max_length=4096)
    signature: str = Field(pattern=r"^(0x)?[0-9a-fA-F]{130}$")


class MessengerRequest(BaseModel):
    initData: str = Field(min_length=1, max_length=8192)


class AccessCodeRequest(BaseModel):
    code: str = Field(min_length=1, max_length=128)


class UserBody(BaseModel):
    id: str
    address: str | None
    displayName: str
    messenger: dict[str, Any] | None = None


class UserResponse(BaseModel):
    user: UserBody


def settings_of(service: Service) -> AuthSettings:
    return service.plugin_settings("auth", AuthSettings)


def siwe_params(service: Service) -> SiweParams:
    settings = settings_of(service)
    public_url = service.settings.service.public_url
    domain = settings.siwe_domain or public_url.split("://", 1)[-1].rstrip("/")
    return SiweParams(domain=domain, uri=settings.siwe_uri or public_url,
                      chain_id=settings.siwe_chain_id, statement=settings.siwe_statement)


def hash_code(code: str) -> str:
    return hashlib.sha256(code.strip().encode()).hexdigest()


def short_address(address: str) -> str:
    return f"{address[:6]}…{address[-4:]}"


def _find_or_create(connection: Connection, where: dict[str, Any], **create: Any) -> User:
    """The user matching ``where``, created with ``where`` and ``create`` at first sign-in."""
    user = find_user(connection, **where)
    if user is not None:
        return user
    try:
        with connection.begin_nested():
            return create_user(connection, **where, **create)
    except IntegrityError:  # a concurrent first sign-in of the same identity won
        found = find_user(connection, **where)
        assert found is not None
        return found


async def _signed_in(service: Service, user: User, claims: SessionClaims) -> Response:
    token = issue_token(service.settings.jwt.secret, claims)
    response = json_response({"user": user.public()})
    set_session_cookie(response, service, token, claims.expires_at - claims.issued_at)
    return response


def build_blueprint(service: Service) -> Blueprint:
    blueprint = Blueprint("auth", __name__)
    days = service.settings.jwt.session_days

    @blueprint.post("/auth/nonce")
    @validate_request(NonceRequest)
    @document_response(NonceResponse, 200)
    async def nonce(data: NonceRequest) -> Response:
        """Issue a single-use SIWE nonce and the exact message to sign."""
        address = data.address.lower()
        issued = utcnow()
        expires = expiry(issued, settings_of(service).nonce_ttl_seconds)
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
        address = data.address.lower()
        nonce_value = nonce_of(data.message)
        if nonce_value is None:
            raise InvalidRequest("message is not a SIWE message issued by this service",
                                 details=[{"field": "message", "message": "no nonce line"}])

        def consume(connection: Connection) -> tuple[User, SessionClaims]:
            row = connection.execute(select(nonces).where(nonces.c.nonce == nonce_value)).first()
            if row is None or as_utc(row.expires_at) <= utcnow():
                raise NonceExpired("the nonce is unknown or older than 5 minutes; ask a new one")
            if row.used_at is not None:
                raise NonceUsed("the nonce was already used; ask a new one")
            if row.message != data.message or row.address != address:
                raise InvalidRequest("message or address differs from the one issued",
                                     details=[{"field": "message", "message": "not as issued"}])
            if recover_signer(data.message, data.signature) != address:
                raise SignatureInvalid("the signature does not match the address")
            claimed = connection.execute(update(nonces).where(nonces.c.nonce == nonce_value)
                                         .where(nonces.c.used_at.is_(None))
                                         .values(used_at=utcnow())).rowcount
            if claimed != 1:
                raise NonceUsed("the nonce was already used; ask a new one")
            user = _find_or_create(connection, {"address": address},
                                   display_name=short_address(address))
            return user, start_session(connection, user.id, address, "siwe", days)

        user, claims = await service.db.write(consume)
        return await _signed_in(service, user, claims)

    @blueprint.post("/auth/messenger")
    @validate_request(MessengerRequest)
    @document_response(UserResponse, 200)
    async def messenger(data: MessengerRequest) -> Response:
        """Sign in with the messaging platform's WebApp initData (used by the bot)."""
        settings = settings_of(service)
        identity = validate_init_data(data.initData, settings.bot_token,
                                      settings.messenger_max_age_seconds)
        current = g.get("principal")
        current_id = current.user_id if current and current.via != "internal" else None

        def link(connection: Connection) -> tuple[User, SessionClaims]:
            user = _link_messenger(connection, identity, current_id)
            return user, start_session(connection, user.id, user.address, "messenger", days)

        user, claims = await service.db.write(link)
        return await _signed_in(service, user, claims)

    @blueprint.post("/auth/access-code")
    @validate_request(AccessCodeRequest)
    @document_response(UserResponse, 200)
    async def access_code(data: AccessCodeRequest) -> Response:
        """Sign in (or up) with a single-use access code."""
        code_hash = hash_code(data.code)
        current = g.get("principal")
        current_id = current.user_id if current and current.via != "internal" else None

        def redeem(connection: Connection) -> tuple[User, SessionClaims]:
            user = get_user(connection, current_id) if current_id else None
            if user is None:
                user = create_user(connection, display_name="FLOW member")
            used = connection.execute(
                update(access_codes).where(access_codes.c.code_hash == code_hash)
                .where(access_codes.c.used_at.is_(None))
                .values(used_at=utcnow(), used_by=user.id)).rowcount
            if used != 1:  # raising rolls back the user created above
                raise CodeInvalid("the access code is unknown or already used")
            return user, start_session(connection, user.id, user.address, "access_code", days)

        user, claims = await service.db.write(redeem)
        return await _signed_in(service, user, claims)

    @blueprint.post("/auth/logout")
    async def logout() -> Response:
        """Revoke the current session and clear the cookie (204)."""
        principal = require_user()
        if principal.via != "session" or principal.session_id is None:
            raise Unauthenticated("logout needs a session, not an API key")
        session_id = principal.session_id
        claims: SessionClaims = g.session_claims
        await service.db.write(revoke_session, session_id)
        await service.registry.lookup(REVOCATIONS_ACTOR).call(
            ("revoked", session_id, float(claims.expires_at)))
        await service.shared.publish(REVOKED_CHANNEL, f"{session_id} {claims.expires_at}")
        response = Response("", status=204)
        clear_session_cookie(response, service)
        g.session_rotation = None
        return response

    @blueprint.get("/me")
    @document_response(UserResponse, 200)
    async def me() -> Response:
        """The signed-in user."""
        principal = require_user()
        user = await service.db.read(get_user, principal.user_id)
        if user is None:
            raise NotFound("the user no longer exists")
        return json_response({"user": user.public()})

    return blueprint


def _link_messenger(connection: Connection, identity: MessengerIdentity,
                    current_id: int | None) -> User:
    """The user of ``identity``: found, linked to the signed-in user, or created."""
    linked = find_user(connection, messenger_id=identity.id)
    if linked is not None:
        if current_id is not None and linked.id != current_id:
            raise MessengerLinked("this messaging account is linked to another user")
        return linked
    if current_id is not None:
        from runtime.users import users

        connection.execute(update(users).where(users.c.id == current_id).values(
            messenger_id=identity.id, messenger=identity.public()))
        user = get_user(connection, current_id)
        assert user is not None
        return user
    return _find_or_create(connection, {"messenger_id": identity.id},
                           display_name=identity.display_name(), messenger=identity.public())


def rotation_due(claims: SessionClaims, rotate_after: timedelta) -> bool:
    return utcnow().timestamp() - claims.issued_at >= rotate_after.total_seconds()
