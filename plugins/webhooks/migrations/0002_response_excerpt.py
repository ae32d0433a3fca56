"""webhooks: the start of each attempt's response body

Revision ID: webhooks_0002
Revises: webhooks_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "webhooks_0002"
down_revision = "webhooks_0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("webhook_attempts") as batch:
        batch.add_column(sa.Column("response_excerpt", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("webhook_attempts") as batch:
        batch.drop_column("response_excerpt")
