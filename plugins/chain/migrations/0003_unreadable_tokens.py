"""chain: the registered tokens the indexer cannot read

Revision ID: chain_0003
Revises: chain_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "chain_0003"
down_revision = "chain_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "chain_unreadable_tokens",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("instance", sa.String(42), primary_key=True),
        sa.Column("reason", sa.String(200), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("chain_unreadable_tokens")
