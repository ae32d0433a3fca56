"""The ``auth.housekeeper`` actor: deletes SIWE nonces and sessions that can no longer matter.

A nonce past its expiry can only be answered ``nonce_expired``, which an unknown nonce
gets too; a session past its expiry has no valid token left, revoked or not. Without
this both tables would grow by one row per sign-in attempt forever.
"""

from __future__ import annotations

import logging
from typing import Any

import trio
from sqlalchemy import Connection, delete

from plugins.auth.tables import nonces, sessions
from runtime.actors import ActorSpec, Mailbox
from runtime.backoff import until_available
from runtime.service import Service
from runtime.wire import utcnow

log = logging.getLogger("flowsvc.auth")
HOUSEKEEPER_ACTOR = "auth.housekeeper"
PURGE_INTERVAL_SECONDS = 3600.0


def purge_expired(connection: Connection) -> tuple[int, int]:
    """Delete expired nonces and expired sessions; return how many of each."""
    now = utcnow()
    purged_nonces = connection.execute(delete(nonces).where(nonces.c.expires_at <= now)).rowcount
    purged_sessions = connection.execute(
        delete(sessions).where(sessions.c.expires_at <= now)).rowcount
    return purged_nonces, purged_sessions


def housekeeper_actor(service: Service) -> ActorSpec:
    """Purge once at start, then every ``PURGE_INTERVAL_SECONDS``; it takes no messages.
    A database outage is waited out (``runtime.backoff``), never a crash."""

    async def run(mailbox: Mailbox, *,
                  task_status: trio.TaskStatus[Any] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            purged_nonces, purged_sessions = await until_available(
                lambda: service.db.write(purge_expired),
                what="purging expired nonces and sessions", log=log)
            if purged_nonces or purged_sessions:
                log.info("purged %d expired nonces and %d expired sessions",
                         purged_nonces, purged_sessions)
            await trio.sleep(PURGE_INTERVAL_SECONDS)

    return ActorSpec(name=HOUSEKEEPER_ACTOR, run=run)
