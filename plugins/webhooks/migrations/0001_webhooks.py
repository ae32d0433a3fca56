"""webhooks: subscriptions, event outbox, deliveries, attempts

Revision ID: webhooks_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "webhooks_0001"
down_revision = None
branch_labels = ("webhooks",)
depends_on = "core_0001"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "webhook_subscriptions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("url", sa.String(2048), nullable=False),
        sa.Column("host", sa.String(255), nullable=False),
        sa.Column("events", sa.JSON(), nullable=False),
        sa.Column("secret", sa.String(64), nullable=False),
        sa.Column("previous_secret", sa.String(64), nullable=True),
        sa.Column("previous_secret_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_error_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_webhook_subscriptions_user_id", "webhook_subscriptions", ["user_id"])
    op.create_table(
        "webhook_events",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("user_id", sa.BigInteger(), nullable=False),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("body", sa.LargeBinary(), nullable=False),
    )
    op.create_index("ix_webhook_events_created_at", "webhook_events", ["created_at"])
    op.create_table(
        "webhook_deliveries",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64),
                  sa.ForeignKey("webhook_events.id", ondelete="CASCADE"), nullable=False),
        sa.Column("subscription_id", sa.BigInteger(),
                  sa.ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("retries_left", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claimed_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claim_owner", sa.String(32), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("subscription_id", "event_id", name="uq_webhook_deliveries_sub_event"),
    )
    op.create_index("ix_webhook_deliveries_event_id", "webhook_deliveries", ["event_id"])
    # Only pending rows are ever looked up by due time: a partial index stays small.
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["next_attempt_at"],
                    postgresql_where=sa.text("state = 'pending'"),
                    sqlite_where=sa.text("state = 'pending'"))
    op.create_index("ix_webhook_deliveries_sub_created", "webhook_deliveries",
                    ["subscription_id", "created_at"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("delivery_id", sa.BigInteger(),
                  sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), nullable=False),
        sa.Column("number", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("duration_ms", sa.Integer(), nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("outcome", sa.String(16), nullable=False),
    )
    op.create_index("ix_webhook_attempts_delivery_id", "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    op.drop_table("webhook_events")
    op.drop_table("webhook_subscriptions")
