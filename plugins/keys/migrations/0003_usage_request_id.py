"""keys: the request id of each usage log row (null for charges and older rows)

Revision ID: keys_0003
Revises: keys_0002
"""

import sqlalchemy as sa
from alembic import op

revision = "keys_0003"
down_revision = "keys_0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_key_usage", sa.Column("request_id", sa.String(128), nullable=True))
    op.create_index("ix_api_key_usage_request_id", "api_key_usage", ["request_id"])


def downgrade() -> None:
    op.drop_index("ix_api_key_usage_request_id", "api_key_usage")
    op.drop_column("api_key_usage", "request_id")
