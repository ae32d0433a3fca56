"""Sessions: a JWT in the ``svc_session`` cookie (or a bearer header), revocable on logout.

The JWT carries the user, the session id (``sid``), the address and its times. Checking
it is CPU work plus one question to the ``auth.revocations`` actor, which keeps the ids
of revoked, unexpired sessions in memory: loaded from the database at start, told of new
revocations by the shared fan-out channel (every process hears a logout at once) and
re-read from the database every few seconds in case a message was missed. No request
pays a database round trip to prove its session is alive.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import jwt
import trio
from quart import Response
from sqlalchemy import Connection, insert, select, update

from plugins.auth.tables import sessions
from runtime.actors import ActorSpec, Mailbox, serve_mailbox
from runtime.principal import SESSION_COOKIE
from runtime.service import Service
from runtime.wire import as_utc, utcnow

log = logging.getLogger("flowsvc.auth")
REVOKED_CHANNEL = "auth.revoked"
REVOCATIONS_ACTOR = "auth.revocations"
_ALGORITHM = "HS256"


@dataclass(frozen=True)
class SessionClaims:
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


def extend_session(connection: Connection, session_id: str, expires_at: datetime) -> None:
    connection.execute(update(sessions).where(sessions.c.id == session_id)
                       .values(expires_at=expires_at))


def revoke_session(connection: Connection, session_id: str) -> None:
    connection.execute(update(sessions).where(sessions.c.id == session_id)
                       .where(sessions.c.revoked_at.is_(None)).values(revoked_at=utcnow()))


def _revoked_since(connection: Connection, since: datetime) -> list[tuple[str, float]]:
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


def revocations_actor(service: Service, poll_seconds: float) -> ActorSpec:
    """The actor that owns the set of revoked session ids.

    Messages: ``("is_revoked", sid) -> bool`` and ``("revoked", sid, expires_unix)``.
    """

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        revoked: dict[str, float] = {}
        # Overlap the polls a little so a revocation committed during a poll is not missed.
        since = datetime.fromtimestamp(0).astimezone()
        revoked.update(await service.db.read(_revoked_since, since))
        since = utcnow() - timedelta(seconds=poll_seconds)

        async def listen() -> None:
            async with service.shared.subscribe(REVOKED_CHANNEL) as messages:
                async for message in messages:
                    session_id, _, expires = message.partition(" ")
                    revoked[session_id] = float(expires or time.time() + 86400 * 31)

        async def poll() -> None:
            nonlocal since
            while True:
                await trio.sleep(poll_seconds)
                checked_at = utcnow()
                revoked.update(await service.db.read(_revoked_since, since))
                since = checked_at - timedelta(seconds=poll_seconds)
                now = time.time()
                for session_id in [s for s, exp in revoked.items() if exp <= now]:
                    del revoked[session_id]

        async def handle(message: tuple[Any, ...]) -> bool | None:
            if message[0] == "is_revoked":
                return message[1] in revoked
            revoked[message[1]] = message[2]
            return None

        async with trio.open_nursery() as nursery:
            nursery.start_soon(listen)
            nursery.start_soon(poll)
            task_status.started()
            await serve_mailbox(mailbox, handle)
            nursery.cancel_scope.cancel()

    return ActorSpec(name=REVOCATIONS_ACTOR, run=run, mailbox_size=1024)
