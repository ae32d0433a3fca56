"""Key records: the raw key format, its hash, and every database read and write of a key.

The raw key is ``sk_live_`` + 64 lowercase hex characters (32 bytes from ``secrets``); it is
returned once and never stored. Only its SHA-256 is stored and looked up: the key carries
256 bits of entropy, so a fast hash cannot be brute-forced and a slow one (bcrypt) would
only cost every request CPU. ``prefix`` (the first 12 characters) is the public label.
"""

from __future__ import annotations

import hashlib
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import Connection, Row, Select, case, func, insert, select, update

from plugins.keys.errors import KeyLimitReached
from plugins.keys.periods import SpendPeriod, epoch_of, period_key, period_key_at, reset_text_at
from plugins.keys.tables import api_keys
from runtime.users import users
from runtime.wire import as_utc, format_flow, iso

RAW_KEY = re.compile(r"^sk_live_[0-9a-f]{64}$")
KEY_PREFIX = "sk_live_"
PREFIX_LENGTH = 12


def new_raw_key() -> str:
    """A fresh raw key: ``sk_live_`` + 64 hex characters from 32 random bytes."""
    return KEY_PREFIX + secrets.token_hex(32)


def hash_key(raw: str) -> str:
    """The stored and looked-up form of a raw key (hex SHA-256)."""
    return hashlib.sha256(raw.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRecord:
    """One API key as stored (never the raw key), with its owner's address."""

    id: int
    user_id: int
    address: str | None
    name: str
    prefix: str
    key_hash: str
    rate_limit_rpm: int
    spend_limit: int | None
    spend_period: SpendPeriod
    spend_epoch: int
    spend_period_key: int
    spend_used: int
    created_at: datetime
    last_used_at: datetime | None
    revoked_at: datetime | None

    def current_period_key(self, now: datetime | float) -> int:
        """The key of the period holding ``now`` (a datetime, or Unix seconds)."""
        unix = now if isinstance(now, float | int) else now.timestamp()
        return period_key_at(self.spend_epoch, self.spend_period, unix)

    def stored_spend(self, current_key: int) -> int:
        """What the database says was spent in the period ``current_key`` (0 for another)."""
        return self.spend_used if self.spend_period_key == current_key else 0

    def public(self, period_used: int, now: datetime) -> dict[str, Any]:
        """The public shape: limits, current spend, times; never the raw key or its hash."""
        return {
            "id": str(self.id),
            "name": self.name,
            "prefix": self.prefix,
            "rate_limit_rpm": self.rate_limit_rpm,
            "spend_limit_flow": None if self.spend_limit is None else format_flow(self.spend_limit),
            "spend_period": self.spend_period,
            "spend_period_used": format_flow(period_used),
            "spend_period_reset": reset_text_at(self.spend_period, now.timestamp()),
            "created_at": iso(self.created_at),
            "last_used_at": None if self.last_used_at is None else iso(self.last_used_at),
            "revoked_at": None if self.revoked_at is None else iso(self.revoked_at),
        }


def _select() -> Select[Any]:
    return select(api_keys, users.c.address).join(users, users.c.id == api_keys.c.user_id)


def _record(row: Row[Any]) -> KeyRecord:
    values = row._mapping
    return KeyRecord(
        id=int(values["id"]), user_id=int(values["user_id"]), address=values["address"],
        name=values["name"], prefix=values["prefix"], key_hash=values["key_hash"],
        rate_limit_rpm=int(values["rate_limit_rpm"]), spend_limit=values["spend_limit"],
        spend_period=cast(SpendPeriod, values["spend_period"]),
        spend_epoch=int(values["spend_epoch"]), spend_period_key=int(values["spend_period_key"]),
        spend_used=int(values["spend_used"]), created_at=as_utc(values["created_at"]),
        last_used_at=as_utc(values["last_used_at"]) if values["last_used_at"] else None,
        revoked_at=as_utc(values["revoked_at"]) if values["revoked_at"] else None)


def insert_key(connection: Connection, *, user_id: int, name: str, rate_limit_rpm: int,
               spend_limit: int | None, spend_period: SpendPeriod, raw_key: str,
               max_keys: int, now: datetime) -> KeyRecord:
    """Store a new key (its hash) for ``user_id``.

    :raises KeyLimitReached: the user already has ``max_keys`` active keys.
    """
    active = connection.execute(
        select(func.count()).select_from(api_keys)
        .where(api_keys.c.user_id == user_id, api_keys.c.revoked_at.is_(None))).scalar_one()
    if active >= max_keys:
        raise KeyLimitReached(f"a user may have at most {max_keys} active API keys; "
                              f"revoke one first")
    key_id = connection.execute(insert(api_keys).values(
        user_id=user_id, name=name, prefix=raw_key[:PREFIX_LENGTH], key_hash=hash_key(raw_key),
        rate_limit_rpm=rate_limit_rpm, spend_limit=spend_limit, spend_period=spend_period,
        spend_epoch=0, spend_period_key=period_key(0, spend_period, now), spend_used=0,
        created_at=now, updated_at=now)).inserted_primary_key[0]  # type: ignore[index]
    record = load_by_id(connection, int(key_id))
    assert record is not None
    return record


def list_active(connection: Connection, user_id: int, before_id: int | None,
                limit: int) -> list[KeyRecord]:
    """The user's active keys, newest first, with ids below ``before_id`` (a page)."""
    query = _select().where(api_keys.c.user_id == user_id, api_keys.c.revoked_at.is_(None))
    if before_id is not None:
        query = query.where(api_keys.c.id < before_id)
    rows = connection.execute(query.order_by(api_keys.c.id.desc()).limit(limit))
    return [_record(row) for row in rows]


def get_owned(connection: Connection, user_id: int, key_id: int) -> KeyRecord | None:
    """The key ``key_id`` when ``user_id`` owns it (revoked keys included, for audit)."""
    row = connection.execute(
        _select().where(api_keys.c.id == key_id, api_keys.c.user_id == user_id)).first()
    return _record(row) if row else None


def load_by_hash(connection: Connection, key_hash: str) -> KeyRecord | None:
    row = connection.execute(_select().where(api_keys.c.key_hash == key_hash)).first()
    return _record(row) if row else None


def load_by_id(connection: Connection, key_id: int) -> KeyRecord | None:
    row = connection.execute(_select().where(api_keys.c.id == key_id)).first()
    return _record(row) if row else None


def update_limits(connection: Connection, user_id: int, key_id: int, changes: dict[str, Any],
                  now: datetime) -> KeyRecord | None:
    """Apply ``changes`` (column name to value) to an active key of ``user_id``.

    A change of ``spend_period`` starts a new epoch with nothing spent.

    :return: the updated key; None when the user has no such active key.
    """
    current = get_owned(connection, user_id, key_id)
    if current is None or current.revoked_at is not None:
        return None
    values = dict(changes)
    period = values.get("spend_period", current.spend_period)
    if period != current.spend_period:
        epoch = current.spend_epoch + 1
        values.update(spend_epoch=epoch, spend_used=0,
                      spend_period_key=period_key(epoch, period, now))
    connection.execute(update(api_keys).where(api_keys.c.id == key_id)
                       .values(**values, updated_at=now))
    return get_owned(connection, user_id, key_id)


def revoke(connection: Connection, user_id: int, key_id: int, now: datetime) -> KeyRecord | None:
    """Revoke an active or rotating key of ``user_id``; the record stays for audit.

    :return: the revoked key; None when the user has no such active key.
    """
    result = connection.execute(
        update(api_keys).where(api_keys.c.id == key_id, api_keys.c.user_id == user_id,
                               api_keys.c.revoked_at.is_(None) | (api_keys.c.revoked_at > now))
        .values(revoked_at=now, updated_at=now))
    return get_owned(connection, user_id, key_id) if result.rowcount else None


def changed_since(connection: Connection, since: datetime) -> list[int]:
    """Ids of keys changed or revoked at or after ``since`` (the invalidation poll)."""
    rows = connection.execute(select(api_keys.c.id).where(api_keys.c.updated_at >= since))
    return [int(row.id) for row in rows]


def add_spend(connection: Connection, deltas: dict[tuple[int, int], int]) -> None:
    """Add spend deltas, each ``(key id, period key) -> micro-FLOW``, to the stored spend.

    A delta for a newer period than the stored one starts that period; a delta for an
    older period or another epoch (``spend_period`` changed meanwhile) is dropped.
    """
    for (key_id, key), delta in deltas.items():
        same_period = api_keys.c.spend_period_key == key
        connection.execute(
            update(api_keys)
            .where(api_keys.c.id == key_id, api_keys.c.spend_epoch == epoch_of(key),
                   api_keys.c.spend_period_key <= key)
            .values(spend_used=case((same_period, api_keys.c.spend_used + delta),
                                    else_=max(delta, 0)),
                    spend_period_key=key))
