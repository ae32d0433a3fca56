"""billing: subscriptions, invoices, payments and processed provider callbacks

Revision ID: billing_0001
Revises:
"""

from datetime import datetime

import sqlalchemy as sa
from alembic import op

revision = "billing_0001"
down_revision = None
branch_labels = ("billing",)
depends_on = "core_0001"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _time(name: str, nullable: bool = True) -> sa.Column[datetime]:
    return sa.Column(name, sa.DateTime(timezone=True), nullable=nullable)


def upgrade() -> None:
    op.create_table(
        "billing_subscriptions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("live_user_id", sa.BigInteger(), nullable=True, unique=True),
        sa.Column("tier", sa.String(8), nullable=False),
        sa.Column("next_tier", sa.String(8), nullable=True),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("status", sa.String(12), nullable=False),
        _time("period_start"),
        _time("renews_at"),
        _time("ends_at"),
        sa.Column("retries", sa.Integer(), nullable=False),
        _time("due_at"),
        sa.Column("customer_ref", sa.String(255), nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.Column("claim_owner", sa.String(32), nullable=True),
        _time("claimed_until"),
        sa.Column("version", sa.Integer(), nullable=False),
        _time("created_at", nullable=False),
        _time("updated_at", nullable=False),
    )
    op.create_index("ix_billing_subscriptions_user_id", "billing_subscriptions", ["user_id"])
    op.create_index("ix_billing_subscriptions_due_at", "billing_subscriptions", ["due_at"])
    op.create_table(
        "billing_invoices",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("subscription_id", sa.BigInteger(),
                  sa.ForeignKey("billing_subscriptions.id"), nullable=False),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("purpose", sa.String(12), nullable=False),
        sa.Column("tier", sa.String(8), nullable=False),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        _time("period_end"),
        sa.Column("token_amount", sa.String(80), nullable=True),
        sa.Column("token_reserved", sa.String(80), nullable=True, unique=True),
        sa.Column("attempt_key", sa.String(64), nullable=True, unique=True),
        sa.Column("provider_ref", sa.String(255), nullable=True),
        sa.Column("checkout_url", sa.String(2048), nullable=True),
        sa.Column("status", sa.String(8), nullable=False),
        _time("expires_at", nullable=False),
        _time("created_at", nullable=False),
        _time("paid_at"),
    )
    op.create_index("ix_billing_invoices_subscription_id", "billing_invoices",
                    ["subscription_id"])
    op.create_index("ix_billing_invoices_user_id", "billing_invoices", ["user_id"])
    op.create_table(
        "billing_payments",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("reference", sa.String(255), nullable=False),
        sa.Column("invoice_id", sa.BigInteger(), sa.ForeignKey("billing_invoices.id"),
                  nullable=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=True),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("token_amount", sa.String(80), nullable=True),
        sa.Column("sender", sa.String(64), nullable=True),
        sa.Column("outcome", sa.String(12), nullable=False),
        _time("received_at", nullable=False),
        sa.UniqueConstraint("provider", "reference", name="uq_billing_payments_reference"),
    )
    op.create_index("ix_billing_payments_invoice_id", "billing_payments", ["invoice_id"])
    op.create_index("ix_billing_payments_user_id", "billing_payments", ["user_id"])
    op.create_index("ix_billing_payments_outcome", "billing_payments", ["outcome"])
    op.create_table(
        "billing_callbacks",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("provider", sa.String(16), nullable=False),
        sa.Column("event_id", sa.String(255), nullable=False),
        _time("received_at", nullable=False),
        sa.UniqueConstraint("provider", "event_id", name="uq_billing_callbacks_event"),
    )


def downgrade() -> None:
    op.drop_table("billing_callbacks")
    op.drop_table("billing_payments")
    op.drop_table("billing_invoices")
    op.drop_table("billing_subscriptions")
