"""keys: the charge ledger (one row per charge token)

Revision ID: keys_0002
Revises: keys_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "keys_0002"
down_revision = "keys_0001"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "key_charges",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("token", sa.String(128), nullable=False),
        sa.Column("key_id", sa.BigInteger(), sa.ForeignKey("api_keys.id"), nullable=False),
        sa.Column("amount", sa.BigInteger(), nullable=False),
        sa.Column("model", sa.String(64), nullable=False),
        sa.Column("state", sa.String(8), nullable=False),
        sa.Column("period_key", sa.BigInteger(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("settled_at", sa.DateTime(timezone=True), nullable=True),
        sa.UniqueConstraint("token", name="uq_key_charges_token"),
    )
    op.create_index("ix_key_charges_state_created_at", "key_charges", ["state", "created_at"])


def downgrade() -> None:
    op.drop_table("key_charges")
