"""Who is calling: the credentials a request carries and the caller they resolve to."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SESSION_COOKIE = "svc_session"


@dataclass(frozen=True)
class Credentials:
    """The raw credentials of one request; secrets, never logged.

    :param api_key: the ``x-api-key`` header.
    :param bearer: the token of ``Authorization: Bearer``.
    :param session_cookie: the ``svc_session`` cookie.
    """

    api_key: str | None
    bearer: str | None
    session_cookie: str | None

    def __repr__(self) -> str:  # secrets must not reach a log line through repr()
        present = [name for name in ("api_key", "bearer", "session_cookie") if getattr(self, name)]
        return f"Credentials(present={present})"


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    :param user_id: the user acting (for internal callers, 0).
    :param address: the user's EVM address in lowercase, when known.
    :param via: how the caller authenticated.
    :param session_id: the session's id (``jti``) when ``via == "session"``.
    :param key_id: the API key's id when ``via == "api_key"``.
    """

    user_id: int
    address: str | None
    via: Literal["session", "api_key", "internal"]
    session_id: str | None = None
    key_id: int | None = None
