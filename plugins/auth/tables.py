"""Tables of the auth plugin: SIWE nonces, sessions and access codes."""

from sqlalchemy import BigInteger, Column, DateTime, ForeignKey, MetaData, String, Table, Text

metadata = MetaData()

nonces = Table(
    "auth_nonces", metadata,
    Column("nonce", String(32), primary_key=True),
    Column("address", String(42), nullable=False),
    Column("message", Text, nullable=False),
    Column("issued_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False, index=True),
    Column("used_at", DateTime(timezone=True), nullable=True),
)

sessions = Table(
    "auth_sessions", metadata,
    Column("id", String(32), primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("method", String(16), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("revoked_at", DateTime(timezone=True), nullable=True, index=True),
)

access_codes = Table(
    "auth_access_codes", metadata,
    Column("code_hash", String(64), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("used_at", DateTime(timezone=True), nullable=True),
    Column("used_by", BigInteger, ForeignKey("users.id"), nullable=True),
)
