"""Hook implementations of the auth plugin."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from quart import Blueprint, Request, Response, g

from plugins.auth import tables
from plugins.auth.commands import ACCESS_CODES
from plugins.auth.housekeeping import housekeeper_actor
from plugins.auth.routes import build_blueprint
from plugins.auth.session_view import auth_state, session_view_actor
from plugins.auth.sessions import (
    SessionClaims,
    extend_session,
    issue_token,
    rotation_due,
    set_session_cookie,
)
from plugins.auth.settings import AuthSettings
from runtime.actors import ActorSpec
from runtime.cli import Command
from runtime.hookspecs import hookimpl
from runtime.plugin_kit import standard_hooks
from runtime.principal import Credentials, Principal
from runtime.service import Service
from runtime.wire import utcnow

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "auth", AuthSettings, tables.metadata, Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    return [build_blueprint(service)]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    return [session_view_actor(service), housekeeper_actor(service)]


@hookimpl
def flowsvc_commands() -> list[Command]:
    return [ACCESS_CODES]


@hookimpl
def flowsvc_authenticate(service: Service, credentials: Credentials) -> Principal | None:
    """Sessions: the cookie, or a bearer JWT. An ``x-api-key`` request is never a session.

    CPU only: the token memo and the session view answer without I/O (docs/auth.md).
    """
    bearer = credentials.bearer
    if credentials.api_key is not None or (bearer and bearer.startswith("sk_live_")):
        return None  # an API key request is the keys plugin's, whatever cookie comes along
    token = bearer if bearer and bearer.count(".") == 2 else credentials.session_cookie
    if token is None:
        return None
    state = auth_state(service)
    claims = state.tokens.verify(token)
    if claims is None or state.view.is_revoked(claims.session_id):
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
    jwt_settings = service.settings.jwt
    if not rotation_due(claims, jwt_settings.rotate_after_hours):
        return
    now = utcnow()
    expires = now + timedelta(days=jwt_settings.session_days)
    if not await service.db.write(extend_session, claims.session_id, expires):
        return  # revoked while this request ran: no fresh token for it
    rotated = SessionClaims(claims.user_id, claims.session_id, claims.address,
                            int(now.timestamp()), int(expires.timestamp()))
    token = issue_token(jwt_settings.secret, rotated)
    set_session_cookie(response, service, token, rotated.expires_at - rotated.issued_at)
