"""Sessions: a JWT in the ``svc_session`` cookie (or a bearer header), revocable on logout.

The JWT (HS256, PyJWT) carries the user, the session id (``sid``), the address and its
times. Each session is also a row of ``auth_sessions``, so that a logout is durable and
every process can learn of it; the hot path never reads that table (see
``plugins.auth.session_view``). Verifying a token is the largest CPU cost of a session
check, so ``TokenVerifier`` remembers tokens it has already verified.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import jwt
from quart import Response
from sqlalchemy import Connection, insert, select, update

from plugins.auth.tables import sessions
from runtime.principal import SESSION_COOKIE
from runtime.service import Service
from runtime.wire import as_utc, utcnow

_ALGORITHM = "HS256"


@dataclass(frozen=True)
class SessionClaims:
    """What a session token says: who, which session, and when it was issued and expires.

    :param issued_at: Unix seconds; rotation compares it with ``jwt.rotate_after_hours``.
    :param expires_at: Unix seconds; the token is refused from then on.
    """

    user_id: int
    session_id: str
    address: str | None
    issued_at: int
    expires_at: int


def issue_token(secret: str, claims: SessionClaims) -> str:
    payload = {"sub": str(claims.user_id), "sid": claims.session_id, "addr": claims.address,
               "iat": claims.issued_at, "exp": claims.expires_at}
    return jwt.encode(payload, secret, algorithm=_ALGORITHM)


def decode_token(secret: str, token: str) -> SessionClaims | None:
    """The claims of a valid, unexpired token; None for anything else (no detail leaks)."""
    try:
        payload = jwt.decode(token, secret, algorithms=[_ALGORITHM],
                             options={"require": ["sub", "sid", "iat", "exp"]})
        return SessionClaims(user_id=int(payload["sub"]), session_id=str(payload["sid"]),
                             address=payload.get("addr"), issued_at=int(payload["iat"]),
                             expires_at=int(payload["exp"]))
    except (jwt.InvalidTokenError, ValueError, TypeError):
        return None


class TokenVerifier:
    """Verifies session tokens with one secret and remembers the ones it has verified.

    A client sends the same token on every request until it rotates; verifying it again
    (base64, HMAC-SHA256, JSON: about 40 µs with PyJWT here, most of a session check) buys
    nothing, so verified claims are kept by token string, at most ``capacity`` of them
    (the oldest is dropped first). The key is the whole token, signature included, so a hit
    is exactly a string this secret has verified; only the expiry is checked again.
    Invalid tokens are never remembered. Revocation is not its business: see SessionView.

    :param secret: the HS256 key (``jwt.secret``).
    :param capacity: how many verified tokens to keep.
    """

    def __init__(self, secret: str, capacity: int = 4096) -> None:
        self._secret = secret
        self._capacity = capacity
        self._verified: dict[str, SessionClaims] = {}

    def verify(self, token: str) -> SessionClaims | None:
        """The claims of ``token`` if it is a valid, unexpired session token, else None."""
        claims = self._verified.get(token)
        if claims is None:
            claims = decode_token(self._secret, token)
            if claims is None:
                return None
            if len(self._verified) >= self._capacity:
                del self._verified[next(iter(self._verified))]
            self._verified[token] = claims
        if claims.expires_at <= time.time():
            self._verified.pop(token, None)
            return None
        return claims


def rotation_due(claims: SessionClaims, rotate_after_hours: float) -> bool:
    """Whether a cookie session's token is old enough to be replaced by a fresh one."""
    return time.time() - claims.issued_at >= rotate_after_hours * 3600


def start_session(connection: Connection, user_id: int, address: str | None, method: str,
                  days: int) -> SessionClaims:
    """Record a new session and return its claims."""
    now = utcnow()
    expires = now + timedelta(days=days)
    session_id = secrets.token_hex(16)
    connection.execute(insert(sessions).values(
        id=session_id, user_id=user_id, method=method, created_at=now, expires_at=expires))
    return SessionClaims(user_id, session_id, address, int(now.timestamp()),
                         int(expires.timestamp()))


def extend_session(connection: Connection, session_id: str, expires_at: datetime) -> bool:
    """Move the expiry of a live session (rotation); False when it was revoked meanwhile.

    A revoked session is never extended, so the expiry stored at revocation is the latest
    any of its tokens can carry, which is how long its id must stay in the revoked set.
    """
    extended = connection.execute(
        update(sessions).where(sessions.c.id == session_id)
        .where(sessions.c.revoked_at.is_(None)).values(expires_at=expires_at)).rowcount
    return bool(extended)


def revoke_session(connection: Connection, session_id: str) -> int | None:
    """Revoke a session; return its stored expiry (Unix seconds), None if it has no row."""
    connection.execute(update(sessions).where(sessions.c.id == session_id)
                       .where(sessions.c.revoked_at.is_(None)).values(revoked_at=utcnow()))
    expires_at = connection.execute(
        select(sessions.c.expires_at).where(sessions.c.id == session_id)).scalar()
    return None if expires_at is None else int(as_utc(expires_at).timestamp())


def revoked_since(connection: Connection, since: datetime) -> list[tuple[str, float]]:
    """Ids and expiries (Unix seconds) of unexpired sessions revoked at or after ``since``."""
    rows = connection.execute(
        select(sessions.c.id, sessions.c.expires_at)
        .where(sessions.c.revoked_at >= since).where(sessions.c.expires_at > utcnow()))
    return [(row.id, as_utc(row.expires_at).timestamp()) for row in rows]


def set_session_cookie(response: Response, service: Service, token: str, max_age: int) -> None:
    response.set_cookie(SESSION_COOKIE, token, max_age=max_age, httponly=True,
                        secure=service.settings.service.cookie_secure, samesite="Lax", path="/")


def clear_session_cookie(response: Response, service: Service) -> None:
    response.set_cookie(SESSION_COOKIE, "", max_age=0, expires=0, httponly=True,
                        secure=service.settings.service.cookie_secure, samesite="Lax", path="/")
