"""chain: the token registry

Revision ID: chain_0001
Revises:

The ``tokens`` table was created by ``projects_0001`` until the registry moved to the
chain plugin; a database migrated then already has it (with its rows), so this revision
creates it only when it is missing. ``projects_0001`` depends on this revision, for its
foreign key ``projects.token_slug -> tokens.slug``.
"""

import sqlalchemy as sa
from alembic import op

revision = "chain_0001"
down_revision = None
branch_labels = ("chain",)
depends_on = "core_0001"


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("tokens"):
        return
    op.create_table(
        "tokens",
        sa.Column("slug", sa.String(64), primary_key=True),
        sa.Column("owner_address", sa.String(42), nullable=False),
        sa.Column("template", sa.String(16), nullable=False),
        sa.Column("chain_id", sa.BigInteger(), nullable=False),
        sa.Column("instance_address", sa.String(42), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("chain_id", "instance_address", name="uq_tokens_instance"),
    )
    op.create_index("ix_tokens_owner_address", "tokens", ["owner_address"])


def downgrade() -> None:
    op.drop_table("tokens")
