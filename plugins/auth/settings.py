"""The ``[plugins.auth]`` settings table."""

from pydantic import Field, field_validator

from runtime.config import Section


class AuthSettings(Section):
    """Sign-in (SIWE, messenger, access codes), sessions, and the messaging bot.

    ``docs/auth.md`` documents every key.
    """

    siwe_domain: str = ""
    siwe_uri: str = ""
    siwe_chain_id: int = Field(56, ge=1)
    siwe_statement: str = "Sign in to FLOW."
    nonce_ttl_seconds: int = Field(300, ge=1)
    bot_token: str = ""
    bot_api_base_url: str = "https://api.telegram.org"
    bot_send_attempts: int = Field(4, ge=1, le=10)
    bot_send_backoff_seconds: float = Field(0.5, ge=0)
    messenger_max_age_seconds: int = Field(86400, ge=1)
    revocation_poll_seconds: float = Field(5.0, gt=0)
    # How long a process may answer GET /me from memory: the bound on staleness when a user
    # row is changed by code that does not announce it (see docs/auth.md). 0: always read.
    user_cache_seconds: float = Field(30.0, ge=0)

    @field_validator("bot_api_base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value.rstrip("/")
