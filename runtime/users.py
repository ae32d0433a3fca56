"""Users: the one table every plugin refers to, owned by the core.

A user is created at first sign-in (wallet, messaging platform or access code). The
auth plugin owns how users sign in; everything else reads them through these functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    Connection,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    insert,
    select,
)

from runtime.wire import as_utc, utcnow

metadata = MetaData()

Id = BigInteger().with_variant(Integer, "sqlite")

users = Table(
    "users", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("address", String(42), unique=True, nullable=True),
    Column("display_name", String(64), nullable=False),
    Column("messenger_id", BigInteger, unique=True, nullable=True),
    Column("messenger", JSON, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)


@dataclass(frozen=True)
class User:
    id: int
    address: str | None
    display_name: str
    messenger_id: int | None
    messenger: dict[str, Any] | None
    created_at: datetime

    def public(self) -> dict[str, Any]:
        """The spec's User resource (``messenger`` only after a messaging login)."""
        body: dict[str, Any] = {"id": str(self.id), "address": self.address,
                                "displayName": self.display_name}
        if self.messenger is not None:
            body["messenger"] = self.messenger
        return body


def _user(row: Any) -> User:
    return User(id=row.id, address=row.address, display_name=row.display_name,
                messenger_id=row.messenger_id, messenger=row.messenger,
                created_at=as_utc(row.created_at))


def get_user(connection: Connection, user_id: int) -> User | None:
    row = connection.execute(select(users).where(users.c.id == user_id)).first()
    return _user(row) if row else None


def find_user(connection: Connection, **where: Any) -> User | None:
    """The user whose columns equal ``where`` (``address=...`` or ``messenger_id=...``)."""
    query = select(users)
    for name, value in where.items():
        query = query.where(users.c[name] == value)
    row = connection.execute(query).first()
    return _user(row) if row else None


def create_user(connection: Connection, *, display_name: str, address: str | None = None,
                messenger_id: int | None = None, messenger: dict[str, Any] | None = None) -> User:
    user_id = connection.execute(insert(users).values(
        address=address, display_name=display_name, messenger_id=messenger_id,
        messenger=messenger, created_at=utcnow())).inserted_primary_key[0]  # type: ignore[index]
    user = get_user(connection, int(user_id))
    assert user is not None
    return user
