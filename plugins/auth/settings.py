"""The ``[plugins.auth]`` settings table."""

from pydantic import Field

from runtime.config import Section


class AuthSettings(Section):
    siwe_domain: str = ""
    siwe_uri: str = ""
    siwe_chain_id: int = Field(56, ge=1)
    siwe_statement: str = "Sign in to FLOW."
    nonce_ttl_seconds: int = Field(300, ge=1)
    bot_token: str = ""
    messenger_max_age_seconds: int = Field(86400, ge=1)
    revocation_poll_seconds: float = Field(5.0, gt=0)
    # How long a process may answer GET /me from memory: the bound on staleness when a user
    # row is changed by code that does not announce it (see docs/auth.md). 0: always read.
    user_cache_seconds: float = Field(30.0, ge=0)
