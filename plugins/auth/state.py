"""What the auth plugin keeps per service and per request.

``AUTH`` is its state in a service (settings, the token memo and the session view), made
once per service; ``SESSION`` and ``ROTATION`` are its slots in a request's context: the
claims of the session that authenticated the request, and the cookie session whose token
``flowsvc_after_request`` may rotate (None for a bearer session or once a route has set a
cookie of its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from plugins.auth.session_view import SessionView
from plugins.auth.sessions import SessionClaims, TokenVerifier
from plugins.auth.settings import AuthSettings
from runtime.context import RequestSlot
from runtime.service import Service, StateSlot


@dataclass(frozen=True)
class AuthState:
    settings: AuthSettings
    tokens: TokenVerifier
    view: SessionView

    @classmethod
    def create(cls, service: Service) -> AuthState:
        settings = service.plugin_settings("auth", AuthSettings)
        return cls(settings, TokenVerifier(service.settings.jwt.secret),
                   SessionView(settings.user_cache_seconds))


AUTH: StateSlot[AuthState] = StateSlot("auth", AuthState.create)
SESSION: RequestSlot[SessionClaims] = RequestSlot("auth.session")
ROTATION: RequestSlot[SessionClaims] = RequestSlot("auth.rotation")
