"""``Idempotency-Key`` for every write endpoint, once, in the core (spec, Conventions 2).

The key is scoped to the caller (user, or client IP when anonymous). The first request
claims the key with a row in ``idempotency_keys`` (a primary-key insert, so two service
processes on one PostgreSQL cannot both claim it); its response is stored with a
fingerprint of the request for ``limits.idempotency_hours``. A repeat gets the stored
status and body with ``Idempotent-Replayed: true``; a repeat with another request gets
422 ``idempotency_key_reused``; a repeat while the first still runs gets 409
``idempotency_in_progress``. A 5xx answer releases the key so the client can retry.

A route whose answer holds a secret shown once (a raw API key, a webhook secret) must not
have it stored: it writes through ``write_with_replay``, which stores a replay without the
secret in the transaction of the change itself.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from sqlalchemy import (
    Column,
    Connection,
    DateTime,
    Integer,
    LargeBinary,
    String,
    Table,
    delete,
    insert,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError

from runtime.errors import IdempotencyInProgress, IdempotencyKeyReused, InvalidRequest
from runtime.users import metadata
from runtime.wire import as_utc, utcnow

if TYPE_CHECKING:
    from runtime.context import RequestContext
    from runtime.storage import Database

T = TypeVar("T")

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ABANDONED_AFTER = timedelta(minutes=5)
_VALID_KEY = re.compile(r"^[\x21-\x7e]{1,255}$")

idempotency_keys = Table(
    "idempotency_keys", metadata,
    Column("scope", String(128), primary_key=True),
    Column("key", String(255), primary_key=True),
    Column("fingerprint", String(64), nullable=False),
    Column("state", String(16), nullable=False),
    Column("status", Integer, nullable=True),
    Column("body", LargeBinary, nullable=True),
    Column("content_type", String(128), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    # Indexed for purge_expired, as in the core_0001 migration.
    Column("expires_at", DateTime(timezone=True), nullable=False, index=True),
)


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: bytes
    content_type: str | None


def validate_key(key: str) -> str:
    """:raises InvalidRequest: the key is empty, too long or not printable ASCII."""
    if not _VALID_KEY.fullmatch(key):
        raise InvalidRequest(f"{HEADER} must be 1 to 255 printable ASCII characters",
                             details=[{"field": HEADER, "message": "invalid"}])
    return key


def fingerprint(method: str, path: str, query: bytes, body: bytes) -> str:
    digest = hashlib.sha256()
    for part in (method.encode(), path.encode(), query, body):
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return digest.hexdigest()


def claim(connection: Connection, scope: str, key: str, print_: str,
          ttl_hours: float) -> StoredResponse | None:
    """Claim ``key`` for this request, or return the stored response of the first one.

    :return: None when this request owns the key now; the stored response to replay.
    :raises IdempotencyKeyReused: the key was used for a different request.
    :raises IdempotencyInProgress: the first request with this key has not finished.
    """
    now = utcnow()
    where = (idempotency_keys.c.scope == scope) & (idempotency_keys.c.key == key)
    expired = where & (idempotency_keys.c.expires_at < now)
    connection.execute(delete(idempotency_keys).where(expired))
    try:
        with connection.begin_nested():
            connection.execute(insert(idempotency_keys).values(
                scope=scope, key=key, fingerprint=print_, state="in_progress",
                created_at=now, expires_at=now + timedelta(hours=ttl_hours)))
        return None
    except IntegrityError:
        row = connection.execute(select(idempotency_keys).where(where)).one()
    if row.fingerprint != print_:
        raise IdempotencyKeyReused(
            f"{HEADER} {key!r} was already used with a different request")
    if row.state != "done":
        if as_utc(row.created_at) < now - ABANDONED_AFTER:
            # The process that claimed it died mid-request: let this request take over.
            connection.execute(update(idempotency_keys).where(where).values(created_at=now))
            return None
        raise IdempotencyInProgress(f"the first request with {HEADER} {key!r} is still running")
    return StoredResponse(status=row.status, body=row.body, content_type=row.content_type)


def complete(connection: Connection, scope: str, key: str, response: StoredResponse) -> None:
    """Store the first response under the key (or release the key after a 5xx)."""
    where = (idempotency_keys.c.scope == scope) & (idempotency_keys.c.key == key)
    if response.status >= 500:
        connection.execute(delete(idempotency_keys).where(where))
        return
    connection.execute(update(idempotency_keys).where(where).values(
        state="done", status=response.status, body=response.body,
        content_type=response.content_type))


def purge_expired(connection: Connection) -> int:
    """Delete expired keys; returns how many."""
    result = connection.execute(
        delete(idempotency_keys).where(idempotency_keys.c.expires_at < utcnow()))
    return result.rowcount


async def write_with_replay(db: Database, context: RequestContext,
                            change: Callable[..., T], replay: Callable[[T], StoredResponse],
                            *args: Any) -> T:
    """Run ``change(connection, *args)`` in one transaction and, when the request claimed an
    ``Idempotency-Key``, store ``replay(result)`` for its repeats in that same transaction,
    instead of the response the pipeline would store (which may hold a secret shown once).

    A change that raises gives the claim back: the pipeline stores the error answer for the
    repeats (or releases the key after a 5xx), as for any other request.
    """
    claimed = context.take_idempotency()

    def apply(connection: Connection) -> T:
        result = change(connection, *args)
        if claimed is not None:
            complete(connection, *claimed, replay(result))
        return result

    try:
        return await db.write(apply)
    except BaseException:
        context.idempotency = claimed
        raise
