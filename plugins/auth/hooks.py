"""Hook implementations of the auth plugin.

Only the settings and the commands are imported with this module; each hook imports what
it uses, so that ``flowsvc --help``, which loads every plugin's hooks for their commands,
loads no web stack.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from plugins.auth.commands import ACCESS_CODES
from plugins.auth.dev_wallet import DEV_WALLET
from plugins.auth.settings import AuthSettings
from runtime.hookspecs import hookimpl
from runtime.hooktypes import Command
from runtime.plugin_kit import lazy_module, standard_hooks
from runtime.principal import Principal
from runtime.wire import utcnow

if TYPE_CHECKING:
    from quart import Blueprint, Request, Response

    from plugins.auth import sessions
    from plugins.auth import state as auth_state
    from plugins.auth.sessions import SessionClaims
    from runtime.actors import ActorSpec
    from runtime.context import RequestContext
    from runtime.principal import Credentials
    from runtime.service import Service
else:
    # What the request hooks use (see lazy_module).
    sessions = lazy_module("plugins.auth.sessions")
    auth_state = lazy_module("plugins.auth.state")

flowsvc_plugin_config, flowsvc_tables, flowsvc_migrations = standard_hooks(
    "auth", AuthSettings, "plugins.auth.tables", Path(__file__).parent / "migrations")


@hookimpl
def flowsvc_blueprints(service: Service) -> list[Blueprint]:
    from plugins.auth import routes

    return [routes.blueprint]


@hookimpl
def flowsvc_actors(service: Service) -> list[ActorSpec]:
    from plugins.auth.bot import messenger_actor
    from plugins.auth.housekeeping import housekeeper_actor
    from plugins.auth.session_view import session_view_actor
    from plugins.auth.state import AUTH

    state = service.state(AUTH)
    return [session_view_actor(service, state.view, state.settings.revocation_poll_seconds),
            messenger_actor(service, state.settings), housekeeper_actor(service)]


@hookimpl
def flowsvc_commands() -> list[Command]:
    return [ACCESS_CODES, DEV_WALLET]


@hookimpl
def flowsvc_authenticate(service: Service, credentials: Credentials, context: RequestContext
                         ) -> Principal | None:
    """Sessions: the cookie, or a bearer JWT. An ``x-api-key`` request is never a session.

    CPU only: the token memo and the session view answer without I/O (docs/auth.md).
    """
    bearer = credentials.bearer
    if credentials.api_key is not None or (bearer and bearer.startswith("sk_live_")):
        return None  # an API key request is the keys plugin's, whatever cookie comes along
    token = bearer if bearer and bearer.count(".") == 2 else credentials.session_cookie
    if token is None:
        return None
    state = service.state(auth_state.AUTH)
    claims = state.tokens.verify(token)
    if claims is None or state.view.is_revoked(claims.session_id):
        return None
    context.put(auth_state.SESSION, claims)
    if token == credentials.session_cookie:
        context.put(auth_state.ROTATION, claims)
    return Principal(user_id=claims.user_id, address=claims.address, via="session",
                     session_id=claims.session_id)


@hookimpl
def flowsvc_after_request(service: Service, request: Request, response: Response,
                          context: RequestContext) -> Awaitable[None] | None:
    """Rotate a cookie session older than ``jwt.rotate_after_hours``: same session, new token.

    Only a rotation waits (for the database), so only then is an awaitable returned.
    """
    claims = context.get(auth_state.ROTATION)
    if claims is None or response.status_code >= 400 or \
            not sessions.rotation_due(claims, service.settings.jwt.rotate_after_hours):
        return None
    return _rotate(service, response, claims)


async def _rotate(service: Service, response: Response, claims: SessionClaims) -> None:
    jwt_settings = service.settings.jwt
    now = utcnow()
    expires = now + timedelta(days=jwt_settings.session_days)
    if not await service.db.write(sessions.extend_session, claims.session_id, expires):
        return  # revoked while this request ran: no fresh token for it
    rotated = sessions.SessionClaims(claims.user_id, claims.session_id, claims.address,
                                     int(now.timestamp()), int(expires.timestamp()))
    token = sessions.issue_token(jwt_settings.secret, rotated)
    sessions.set_session_cookie(response, service, token, rotated.expires_at - rotated.issued_at)
