"""Tables of the billing plugin.

- ``billing_subscriptions``: one row per checkout. ``live_user_id`` is the user's id while
  the subscription gives (or is about to give back) a tier and NULL otherwise; its unique
  constraint is what allows one live subscription per user, whatever the races.
- ``billing_invoices``: every payment asked for (a checkout, a renewal, an upgrade).
  ``token_reserved`` holds a ``usdt_bep20`` amount while it identifies its invoice (until
  the quarantine after its expiry): unique, so two open invoices never share an amount.
  ``attempt_key`` names one renewal attempt, so a retried attempt reuses its invoice.
- ``billing_payments``: every payment received, granted or not (late, short, duplicate...);
  unique per provider reference, so the same confirmation grants at most once.
- ``billing_callbacks``: the provider events already processed (replays are refused).

Times are UTC. Amounts are micro-USD; on-chain amounts are base-unit integers as text
(18-decimal amounts overflow 64 bits).
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

subscriptions = Table(
    "billing_subscriptions", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("live_user_id", BigInteger, nullable=True, unique=True),
    Column("tier", String(8), nullable=False),
    Column("next_tier", String(8), nullable=True),
    Column("provider", String(16), nullable=False),
    Column("status", String(12), nullable=False),
    Column("period_start", DateTime(timezone=True), nullable=True),
    Column("renews_at", DateTime(timezone=True), nullable=True),
    Column("ends_at", DateTime(timezone=True), nullable=True),
    Column("retries", Integer, nullable=False),
    Column("due_at", DateTime(timezone=True), nullable=True, index=True),
    Column("customer_ref", String(255), nullable=True),
    Column("end_reason", String(32), nullable=True),
    Column("claim_owner", String(32), nullable=True),
    Column("claimed_until", DateTime(timezone=True), nullable=True),
    Column("version", Integer, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

invoices = Table(
    "billing_invoices", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("subscription_id", BigInteger, ForeignKey("billing_subscriptions.id"),
           nullable=False, index=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("purpose", String(12), nullable=False),
    Column("tier", String(8), nullable=False),
    Column("provider", String(16), nullable=False),
    Column("amount_micro", BigInteger, nullable=False),
    Column("period_end", DateTime(timezone=True), nullable=True),
    Column("token_amount", String(80), nullable=True),
    Column("token_reserved", String(80), nullable=True, unique=True),
    Column("attempt_key", String(64), nullable=True, unique=True),
    Column("provider_ref", String(255), nullable=True),
    Column("checkout_url", String(2048), nullable=True),
    Column("status", String(8), nullable=False),
    Column("expires_at", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("paid_at", DateTime(timezone=True), nullable=True),
)

payments = Table(
    "billing_payments", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("provider", String(16), nullable=False),
    Column("reference", String(255), nullable=False),
    Column("invoice_id", BigInteger, ForeignKey("billing_invoices.id"), nullable=True,
           index=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=True, index=True),
    Column("amount_micro", BigInteger, nullable=False),
    Column("token_amount", String(80), nullable=True),
    Column("sender", String(64), nullable=True),
    Column("outcome", String(12), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("provider", "reference", name="uq_billing_payments_reference"),
    Index("ix_billing_payments_outcome", "outcome"),
)

callbacks = Table(
    "billing_callbacks", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("provider", String(16), nullable=False),
    Column("event_id", String(255), nullable=False),
    Column("received_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("provider", "event_id", name="uq_billing_callbacks_event"),
)
