"""auth: nonces, sessions, access codes

Revision ID: auth_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "auth_0001"
down_revision = None
branch_labels = ("auth",)
depends_on = "core_0001"


def upgrade() -> None:
    op.create_table(
        "auth_nonces",
        sa.Column("nonce", sa.String(32), primary_key=True),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("issued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_auth_nonces_expires_at", "auth_nonces", ["expires_at"])
    op.create_table(
        "auth_sessions",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("method", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_auth_sessions_user_id", "auth_sessions", ["user_id"])
    op.create_index("ix_auth_sessions_revoked_at", "auth_sessions", ["revoked_at"])
    op.create_table(
        "auth_access_codes",
        sa.Column("code_hash", sa.String(64), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("used_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("used_by", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("auth_access_codes")
    op.drop_table("auth_sessions")
    op.drop_table("auth_nonces")
