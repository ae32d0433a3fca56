"""Telegram WebApp ``initData`` validation, as Telegram publishes it.

secret_key = HMAC-SHA256(key="WebAppData", msg=bot_token); the expected hash is
HMAC-SHA256(key=secret_key, msg=data_check_string), where the data-check string is every
received field but ``hash``, sorted by key, as ``key=value`` joined by newlines. The
comparison is constant-time and ``auth_date`` must be recent.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl

from plugins.auth.errors import TelegramInvalid
from runtime.inputs import MAX_ID

CLOCK_SKEW_SECONDS = 60
AUTH_DATE_DIGITS = 12


@dataclass(frozen=True)
class MessengerIdentity:
    id: int
    username: str | None
    first_name: str | None
    last_name: str | None

    def public(self) -> dict[str, Any]:
        """The ``user.messenger`` object (see docs/auth.md)."""
        return {"id": str(self.id), "username": self.username,
                "firstName": self.first_name, "lastName": self.last_name}

    def display_name(self) -> str:
        name = " ".join(part for part in (self.first_name, self.last_name) if part)
        return (name or self.username or f"user {self.id}")[:64]


def data_check_string(fields: dict[str, str]) -> str:
    return "\n".join(f"{key}={fields[key]}" for key in sorted(fields) if key != "hash")


def init_data_hash(fields: dict[str, str], bot_token: str) -> str:
    secret_key = hmac.new(b"WebAppData", bot_token.encode(), hashlib.sha256).digest()
    return hmac.new(secret_key, data_check_string(fields).encode(), hashlib.sha256).hexdigest()


def validate_init_data(init_data: str, bot_token: str, max_age_seconds: int,
                       now: float | None = None) -> MessengerIdentity:
    """The identity in ``init_data``.

    :raises TelegramInvalid: no bot token is configured, a field is repeated, the hash does
        not match, the data is older than ``max_age_seconds`` or dated in the future, or it
        carries no user.
    """
    if not bot_token:
        raise TelegramInvalid("messaging-platform login is not configured on this service")
    pairs = parse_qsl(init_data, keep_blank_values=True)
    fields = dict(pairs)
    if len(fields) != len(pairs):
        raise TelegramInvalid("initData repeats a field")
    received = fields.get("hash", "")
    # Bytes, not str: compare_digest refuses non-ASCII strings with a TypeError.
    expected = init_data_hash(fields, bot_token).encode()
    if not received or not hmac.compare_digest(expected, received.encode()):
        raise TelegramInvalid("initData hash does not match")
    try:
        auth_date = _auth_date(fields["auth_date"])
        user = json.loads(fields["user"])
        identity = MessengerIdentity(id=_user_id(user["id"]),
                                     username=_text(user.get("username")),
                                     first_name=_text(user.get("first_name")),
                                     last_name=_text(user.get("last_name")))
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
        raise TelegramInvalid("initData has no valid user or auth_date") from None
    age = (now if now is not None else time.time()) - auth_date
    if age > max_age_seconds:
        raise TelegramInvalid("initData is too old; open the app again")
    if age < -CLOCK_SKEW_SECONDS:
        raise TelegramInvalid("initData is dated in the future")
    return identity


def _auth_date(value: str) -> int:
    """Unix seconds in ASCII digits (``int()`` also reads other scripts' digits, and a
    number of hundreds of digits overflows the float of the age check)."""
    if not (value.isascii() and value.isdigit() and len(value) <= AUTH_DATE_DIGITS):
        raise ValueError("auth_date is not Unix seconds")
    return int(value)


def _user_id(value: Any) -> int:
    """A JSON integer from 1 to 2^63 - 1, what the ``users`` table stores (not ``true``,
    ``7001.9`` or ``"7001"``)."""
    if type(value) is not int or not 0 < value <= MAX_ID:
        raise ValueError("user.id is not an id")
    return value


def _text(value: Any) -> str | None:
    return None if value is None else str(value)
