"""core: users and idempotency keys

Revision ID: core_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "core_0001"
down_revision = None
branch_labels = ("core",)
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "users",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("address", sa.String(42), nullable=True, unique=True),
        sa.Column("display_name", sa.String(64), nullable=False),
        sa.Column("messenger_id", sa.BigInteger(), nullable=True, unique=True),
        sa.Column("messenger", sa.JSON(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "idempotency_keys",
        sa.Column("scope", sa.String(128), primary_key=True),
        sa.Column("key", sa.String(255), primary_key=True),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("status", sa.Integer(), nullable=True),
        sa.Column("body", sa.LargeBinary(), nullable=True),
        sa.Column("content_type", sa.String(128), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_idempotency_keys_expires_at", "idempotency_keys", ["expires_at"])


def downgrade() -> None:
    op.drop_table("idempotency_keys")
    op.drop_table("users")
