"""Tables of the keys plugin: the key records, their usage log and its rollups.

Amounts are BigInteger micro-FLOW. ``spend_used`` is the spend of the period identified by
``spend_period_key`` (see ``plugins.keys.periods``); ``spend_epoch`` grows whenever
``spend_period`` changes, so that spend flushed for an older period can never land in the
new one.

``key_charges`` is the charge ledger: one row per ``Charge`` token, written ``pending``
before the meter is touched and turned ``applied`` in the transaction that writes the
charge's usage row, the key's stored spend and the caller's own record (or ``voiding``
then ``void`` when it is taken back); ``plugins.keys.charging`` explains the order.
"""

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
)

from runtime.users import Id

metadata = MetaData()

api_keys = Table(
    "api_keys", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("name", String(64), nullable=False),
    Column("prefix", String(12), nullable=False),
    Column("key_hash", String(64), nullable=False, unique=True),
    Column("rate_limit_rpm", Integer, nullable=False),
    Column("spend_limit", BigInteger, nullable=True),
    Column("spend_period", String(8), nullable=False),
    Column("spend_epoch", Integer, nullable=False),
    Column("spend_period_key", BigInteger, nullable=False),
    Column("spend_used", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, index=True),
    Column("last_used_at", DateTime(timezone=True), nullable=True),
    Column("revoked_at", DateTime(timezone=True), nullable=True),
)

# On PostgreSQL the log is partitioned by day of ``at`` (keys_0004): its primary key there is
# (id, at), as a partitioned table's must include the partition column; ``id`` alone stays
# unique, as every id comes from the one sequence. SQLite keeps a plain table.
api_key_usage = Table(
    "api_key_usage", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("key_id", BigInteger, ForeignKey("api_keys.id"), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("kind", String(8), nullable=False),
    Column("method", String(8), nullable=True),
    Column("route", String(255), nullable=True),
    Column("status", Integer, nullable=True),
    Column("cost", BigInteger, nullable=False),
    Column("model", String(64), nullable=True),
    Column("latency_us", BigInteger, nullable=True),
    # The X-Request-Id of the request (keys_0003); None for a charge.
    Column("request_id", String(128), nullable=True),
    Index("ix_api_key_usage_key_id_at", "key_id", "at"),
    Index("ix_api_key_usage_at", "at"),
    Index("ix_api_key_usage_request_id", "request_id"),
)

# Per key, per minute, hour and day (``bucket_seconds``, buckets counted from the Unix
# epoch), by kind, model ("unknown" for none) and outcome: written with the usage rows
# (``plugins.keys.rollups``) and read by the usage answers.
api_key_usage_rollups = Table(
    "api_key_usage_rollups", metadata,
    Column("key_id", BigInteger, ForeignKey("api_keys.id"), primary_key=True),
    Column("bucket_seconds", Integer, primary_key=True),
    Column("bucket_start", DateTime(timezone=True), primary_key=True),
    Column("kind", String(8), primary_key=True),
    Column("model", String(64), primary_key=True),
    Column("outcome", String(4), primary_key=True),
    Column("calls", BigInteger, nullable=False),
    Column("cost", BigInteger, nullable=False),
    Column("latency_us", BigInteger, nullable=False),
    Index("ix_api_key_usage_rollups_bucket_start", "bucket_start"),
)

key_charges = Table(
    "key_charges", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("token", String(128), nullable=False),
    Column("key_id", BigInteger, ForeignKey("api_keys.id"), nullable=False),
    Column("amount", BigInteger, nullable=False),
    Column("model", String(64), nullable=False),
    Column("state", String(8), nullable=False),
    Column("period_key", BigInteger, nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("settled_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("token", name="uq_key_charges_token"),
    Index("ix_key_charges_state_created_at", "state", "created_at"),
)
