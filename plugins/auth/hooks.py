"""Hook implementations of the auth plugin."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from quart import Blueprint, Request, Response, g
from sqlalchemy import MetaData

from plugins.auth import tables
from plugins.auth.commands import ACCESS_CODES
from plugins.auth.routes import build_blueprint, rotation_due, settings_of
from plugins.auth.sessions import (
    REVOCATIONS_ACTOR,
    SessionClaims,
    decode_token,
    extend_session,
    issue_token,
    revocations_actor,
    set_session_cookie,
)
from plugins.auth.settings import AuthSettings
from runtime.actors import ActorSpec
from runtime.cli import Command
from runtime.hookspecs import hookimpl
from runtime.principal import Credentials, Principal
from runtime.service import PluginConfig, Service
from runtime.wire import utcnow


@hookimpl
def flowsvc_plugin_config() -> PluginConfig:
    return PluginConfig("auth", AuthSettings)


@hookimpl
def flowsvc_tables() -> MetaData:
    return tables.metadata


@hookimpl
def flowsvc_migrations() -> Path:
    return Path(__file__).parent / "migrations"


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [build_blueprint(service)]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    return [revocations_actor(service, settings_of(service).revocation_poll_seconds)]


@hookimpl
def flowsvc_commands() -> list[Command]:
    return [ACCESS_CODES]


@hookimpl
async def flowsvc_authenticate(service: Service, credentials: Credentials) -> Principal | None:
    """Sessions: the cookie, or a bearer JWT. An ``x-api-key`` request is never a session."""
    if credentials.api_key is not None:
        return None
    token = credentials.bearer if credentials.bearer and credentials.bearer.count(".") == 2 \
        else credentials.session_cookie
    if token is None:
        return None
    claims = decode_token(service.settings.jwt.secret, token)
    if claims is None:
        return None
    if await service.registry.lookup(REVOCATIONS_ACTOR).call(("is_revoked", claims.session_id)):
        return None
    g.session_claims = claims
    g.session_rotation = claims if token == credentials.session_cookie else None
    return Principal(user_id=claims.user_id, address=claims.address, via="session",
                     session_id=claims.session_id)


@hookimpl
async def flowsvc_after_request(service: Service, request: Request, response: Response,
                                principal: Principal | None) -> None:
    """Rotate a cookie session older than ``jwt.rotate_after_hours``: same session, new token."""
    claims: SessionClaims | None = g.get("session_rotation")
    if claims is None or response.status_code >= 400:
        return
    if not rotation_due(claims, timedelta(hours=service.settings.jwt.rotate_after_hours)):
        return
    now = utcnow()
    expires = now + timedelta(days=service.settings.jwt.session_days)
    rotated = SessionClaims(claims.user_id, claims.session_id, claims.address,
                            int(now.timestamp()), int(expires.timestamp()))
    await service.db.write(extend_session, claims.session_id, expires)
    token = issue_token(service.settings.jwt.secret, rotated)
    set_session_cookie(response, service, token, rotated.expires_at - rotated.issued_at)
