"""How each sign-in method finds or makes its user, inside the sign-in's own transaction.

Every function here takes the connection of one ``Database.write`` and raises the
plugin's errors, which roll that transaction back (a user created for a code that turns
out to be used is never committed).
"""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from sqlalchemy import Connection, insert, select, update
from sqlalchemy.exc import IntegrityError

from plugins.auth.errors import (
    CodeInvalid,
    MessengerLinked,
    NonceExpired,
    NonceUsed,
    SignatureInvalid,
)
from plugins.auth.messenger import MessengerIdentity
from plugins.auth.tables import access_codes, nonces
from runtime.errors import InvalidRequest, Unauthenticated
from runtime.users import User, create_user, find_user, get_user, users
from runtime.wire import as_utc, utcnow


def hash_code(code: str) -> str:
    """The stored form of an access code (only hashes are stored)."""
    return hashlib.sha256(code.strip().encode()).hexdigest()


def new_access_codes(connection: Connection, count: int) -> list[str]:
    """Create ``count`` single-use codes; only their hashes are stored."""
    codes = [f"ac_{secrets.token_urlsafe(18)}" for _ in range(count)]
    now = utcnow()
    connection.execute(insert(access_codes),
                       [{"code_hash": hash_code(code), "created_at": now} for code in codes])
    return codes


def short_address(address: str) -> str:
    return f"{address[:6]}…{address[-4:]}"


def find_or_create(connection: Connection, where: dict[str, Any], **create: Any) -> User:
    """The user matching ``where``, created with ``where`` and ``create`` at first sign-in."""
    user = find_user(connection, **where)
    if user is not None:
        return user
    try:
        with connection.begin_nested():
            return create_user(connection, **where, **create)
    except IntegrityError:  # a concurrent first sign-in of the same identity won
        found = find_user(connection, **where)
        if found is None:
            raise
        return found


def consume_nonce(connection: Connection, nonce: str, address: str, message: str,
                  signer: str | None) -> User:
    """Mark a SIWE nonce used and return the wallet's user (created at first sign-in).

    :param signer: the lowercase address the signature recovers to (None: unrecoverable).
    :raises NonceExpired: the nonce is unknown (expired ones are purged) or expired.
    :raises NonceUsed: the nonce was verified before, or concurrently by another request.
    :raises InvalidRequest: the message or address is not exactly the one issued.
    :raises SignatureInvalid: the signature was not made by ``address``.
    """
    row = connection.execute(select(nonces).where(nonces.c.nonce == nonce)).first()
    if row is None or as_utc(row.expires_at) <= utcnow():
        raise NonceExpired("the nonce is unknown or has expired; ask a new one")
    if row.used_at is not None:
        raise NonceUsed("the nonce was already used; ask a new one")
    if row.message != message or row.address != address:
        raise InvalidRequest("message or address differs from the one issued",
                             details=[{"field": "message", "message": "not as issued"}])
    if signer != address:
        raise SignatureInvalid("the signature does not match the address")
    # Two verifies of one nonce may both get here; the row lock (PostgreSQL) or the write
    # lock (SQLite) lets only the first flip used_at.
    claimed = connection.execute(update(nonces).where(nonces.c.nonce == nonce)
                                 .where(nonces.c.used_at.is_(None))
                                 .values(used_at=utcnow())).rowcount
    if claimed != 1:
        raise NonceUsed("the nonce was already used; ask a new one")
    return find_or_create(connection, {"address": address}, display_name=short_address(address))


def link_messenger(connection: Connection, identity: MessengerIdentity,
                   current_id: int | None) -> tuple[User, bool]:
    """The user of ``identity``: found, linked to the signed-in user, or created.

    The stored ``messenger`` object is refreshed when the platform's names changed.

    :param current_id: the signed-in caller, who gets the identity linked (replacing any
        other identity of theirs); None to sign in or up with the identity alone.
    :return: the user and whether an existing user row changed (caches must drop it).
    :raises MessengerLinked: the identity belongs to another user than ``current_id``.
    :raises Unauthenticated: the signed-in user no longer exists.
    """
    public = identity.public()
    linked = find_user(connection, messenger_id=identity.id)
    if linked is not None:
        if current_id is not None and linked.id != current_id:
            raise MessengerLinked("this messaging account is linked to another user")
        if linked.messenger == public:
            return linked, False
        return _set_messenger(connection, linked.id, identity), True
    if current_id is not None:
        try:
            with connection.begin_nested():
                return _set_messenger(connection, current_id, identity), True
        except IntegrityError:  # linked to someone else by a concurrent request
            raise MessengerLinked("this messaging account is linked to another user") from None
    user = find_or_create(connection, {"messenger_id": identity.id},
                          display_name=identity.display_name(), messenger=public)
    return user, False


def _set_messenger(connection: Connection, user_id: int, identity: MessengerIdentity) -> User:
    connection.execute(update(users).where(users.c.id == user_id).values(
        messenger_id=identity.id, messenger=identity.public()))
    user = get_user(connection, user_id)
    if user is None:
        raise Unauthenticated("the signed-in user no longer exists")
    return user


def redeem_access_code(connection: Connection, code: str, current_id: int | None) -> User:
    """Use a single-use access code: for the signed-in user, or for a new user.

    :raises CodeInvalid: the code is unknown or already used (also when a concurrent
        request used it first).
    """
    user = get_user(connection, current_id) if current_id is not None else None
    if user is None:
        user = create_user(connection, display_name="FLOW member")
    used = connection.execute(
        update(access_codes).where(access_codes.c.code_hash == hash_code(code))
        .where(access_codes.c.used_at.is_(None))
        .values(used_at=utcnow(), used_by=user.id)).rowcount
    if used != 1:  # raising rolls back the user created above
        raise CodeInvalid("the access code is unknown or already used")
    return user
