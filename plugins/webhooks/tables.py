"""Tables of the webhooks plugin: subscriptions, the event outbox, deliveries and attempts.

An event is stored once (its envelope bytes, signed anew on each attempt) and fans out into
one delivery per matching subscription. A delivery is ``pending`` until it is ``delivered`` or
``failed``; while pending, ``next_attempt_at`` says when it is due (a partial index keeps the
due rows cheap to find) and ``claimed_until`` / ``claim_owner`` lease it to the dispatcher
sending it. Deleting a subscription cascades to its deliveries and their attempts.
"""

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

metadata = MetaData()

Id = BigInteger().with_variant(Integer, "sqlite")
PENDING, DELIVERED, FAILED = "pending", "delivered", "failed"
# The outcome of an attempt until it is settled: in flight, or its process stopped first.
UNKNOWN = "unknown"

subscriptions = Table(
    "webhook_subscriptions", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("url", String(2048), nullable=False),
    Column("host", String(255), nullable=False),
    Column("events", JSON, nullable=False),
    Column("secret", String(64), nullable=False),
    Column("previous_secret", String(64), nullable=True),
    Column("previous_secret_until", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("last_error", Text, nullable=True),
    Column("last_error_at", DateTime(timezone=True), nullable=True),
)

events = Table(
    "webhook_events", metadata,
    Column("id", String(64), primary_key=True),
    Column("user_id", BigInteger, nullable=False),
    Column("name", String(128), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False, index=True),
    Column("body", LargeBinary, nullable=False),
)

deliveries = Table(
    "webhook_deliveries", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("event_id", String(64), ForeignKey("webhook_events.id", ondelete="CASCADE"),
           nullable=False, index=True),
    Column("subscription_id", BigInteger,
           ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"), nullable=False),
    Column("state", String(16), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("retries_left", Integer, nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=True),
    Column("claimed_until", DateTime(timezone=True), nullable=True),
    Column("claim_owner", String(32), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=True),
    UniqueConstraint("subscription_id", "event_id", name="uq_webhook_deliveries_sub_event"),
    Index("ix_webhook_deliveries_due", "next_attempt_at",
          postgresql_where=text("state = 'pending'"), sqlite_where=text("state = 'pending'")),
    Index("ix_webhook_deliveries_sub_created", "subscription_id", "created_at"),
)

attempts = Table(
    "webhook_attempts", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("delivery_id", BigInteger, ForeignKey("webhook_deliveries.id", ondelete="CASCADE"),
           nullable=False, index=True),
    Column("number", Integer, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Column("duration_ms", Integer, nullable=False),
    Column("status_code", Integer, nullable=True),
    Column("error", Text, nullable=True),
    Column("outcome", String(16), nullable=False),
    # The start of the response body (EXCERPT_MAX_BYTES, decoded), for the owner to read.
    Column("response_excerpt", Text, nullable=True),
)
