"""Tables of the chain plugin: the token registry."""

from sqlalchemy import BigInteger, Column, DateTime, MetaData, String, Table, UniqueConstraint

metadata = MetaData()

tokens = Table(
    "tokens", metadata,
    Column("slug", String(64), primary_key=True),
    Column("owner_address", String(42), nullable=False, index=True),
    Column("template", String(16), nullable=False),
    Column("chain_id", BigInteger, nullable=False),
    Column("instance_address", String(42), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("chain_id", "instance_address", name="uq_tokens_instance"),
)
