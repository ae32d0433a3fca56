"""chain: partial indexes on chain_logs, holding only the logs their reads look for

``ix_chain_logs_block`` (every log by block) served only the final work's ``Launched`` and
``Sold``; ``ix_chain_logs_account`` (every log by instance and account) only the placements
and positions of users. Most logs (rewards, buys) are read by no query but the reorg's, by
block hash (the primary key): each log wrote three index entries, now one or two.

Revision ID: chain_0004
Revises: chain_0003
"""

import sqlalchemy as sa
from alembic import op

revision = "chain_0004"
down_revision = "chain_0003"
branch_labels = None
depends_on = None

FINAL_LOGS = "event IN ('Launched', 'Sold')"
POSITION_LOGS = "event IN ('UserPlaced', 'Activated', 'ActiveUntilSet')"


def upgrade() -> None:
    op.drop_index("ix_chain_logs_block", table_name="chain_logs")
    op.drop_index("ix_chain_logs_account", table_name="chain_logs")
    op.create_index("ix_chain_logs_final", "chain_logs", ["chain_id", "block_number"],
                    postgresql_where=sa.text(FINAL_LOGS), sqlite_where=sa.text(FINAL_LOGS))
    op.create_index("ix_chain_logs_position", "chain_logs", ["chain_id", "instance", "account"],
                    postgresql_where=sa.text(POSITION_LOGS),
                    sqlite_where=sa.text(POSITION_LOGS))


def downgrade() -> None:
    op.drop_index("ix_chain_logs_position", table_name="chain_logs")
    op.drop_index("ix_chain_logs_final", table_name="chain_logs")
    op.create_index("ix_chain_logs_block", "chain_logs", ["chain_id", "block_number"])
    op.create_index("ix_chain_logs_account", "chain_logs", ["chain_id", "instance", "account"])
