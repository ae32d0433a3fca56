"""The in-memory parts of the session check: the token memo and the session view's rules."""

from __future__ import annotations

import time

import jwt
import pytest

from plugins.auth.session_view import SessionView
from plugins.auth.sessions import SessionClaims, TokenVerifier, issue_token
from runtime.errors import Unavailable

SECRET = "unit-secret-" + "z" * 32


def _token(session_id: str, expires_in: int = 3600) -> str:
    now = int(time.time())
    return issue_token(SECRET, SessionClaims(1, session_id, None, now, now + expires_in))


def test_verifier_remembers_valid_tokens_only_and_stays_bounded() -> None:
    verifier = TokenVerifier(SECRET, capacity=2)
    first, second, third = _token("a"), _token("b"), _token("c")
    assert verifier.verify("not.a.token") is None
    assert verifier.verify(jwt.encode({"sub": "1"}, "other-secret-" + "q" * 32)) is None
    claims = [verifier.verify(token) for token in (first, second, third)]
    assert [c.session_id for c in claims if c] == ["a", "b", "c"]
    assert len(verifier._verified) == 2 and first not in verifier._verified
    assert verifier.verify(first) is not None  # dropped from the memo, verified again


def test_view_refuses_to_answer_before_its_first_load() -> None:
    view = SessionView(user_seconds=30)
    with pytest.raises(Unavailable):
        view.is_revoked("a")
    view.reset([("a", time.time() + 60)])
    assert view.is_revoked("a") and not view.is_revoked("b")


def test_a_fill_read_before_a_user_change_is_refused() -> None:
    view = SessionView(user_seconds=30)
    view.reset([])
    epoch = view.epoch                       # a request starts reading user 1
    view.forget_user(1)                      # meanwhile user 1 changes
    assert not view.remember_user(1, {"id": "1", "old": True}, epoch)
    assert view.cached_user(1) is None
    assert view.remember_user(1, {"id": "1"}, view.epoch)
    assert view.cached_user(1) == {"id": "1"}
    view.forget_user(1)
    assert view.cached_user(1) is None


def test_expired_revocations_and_stale_users_are_dropped() -> None:
    view = SessionView(user_seconds=0.001)
    view.reset([("gone", time.time() - 1), ("live", time.time() + 60)])
    view.revoke("live", time.time() + 10)    # an older expiry never shortens the entry
    assert view.remember_user(1, {"id": "1"}, view.epoch)
    time.sleep(0.002)
    assert view.cached_user(1) is None
    view.drop_expired()
    assert not view.is_revoked("gone") and view.is_revoked("live")
    assert view._revoked["live"] > time.time() + 50 and not view._users


def test_a_zero_lifetime_disables_the_user_cache() -> None:
    view = SessionView(user_seconds=0)
    view.reset([])
    assert not view.remember_user(1, {"id": "1"}, view.epoch)
    assert view.cached_user(1) is None
