"""keys: API keys and their usage log

Revision ID: keys_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "keys_0001"
down_revision = None
branch_labels = ("keys",)
depends_on = "core_0001"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(12), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("rate_limit_rpm", sa.Integer(), nullable=False),
        sa.Column("spend_limit", sa.BigInteger(), nullable=True),
        sa.Column("spend_period", sa.String(8), nullable=False),
        sa.Column("spend_epoch", sa.Integer(), nullable=False),
        sa.Column("spend_period_key", sa.BigInteger(), nullable=False),
        sa.Column("spend_used", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_api_keys_user_id", "api_keys", ["user_id"])
    op.create_index("ix_api_keys_updated_at", "api_keys", ["updated_at"])
    op.create_table(
        "api_key_usage",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("key_id", sa.BigInteger(), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(8), nullable=False),
        sa.Column("method", sa.String(8), nullable=True),
        sa.Column("route", sa.String(255), nullable=True),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("cost", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(64), nullable=True),
        sa.Column("latency_us", sa.BigInteger(), nullable=True),
    )
    op.create_index("ix_api_key_usage_key_id_at", "api_key_usage", ["key_id", "at"])
    op.create_index("ix_api_key_usage_at", "api_key_usage", ["at"])


def downgrade() -> None:
    op.drop_table("api_key_usage")
    op.drop_table("api_keys")
