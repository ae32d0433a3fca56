"""chain: the indexer's cursors, blocks, raw logs, derived counters and FLOW balance alerts

Revision ID: chain_0002
Revises: chain_0001
"""

import sqlalchemy as sa
from alembic import op

revision = "chain_0002"
down_revision = "chain_0001"
branch_labels = None
depends_on = None

AMOUNT = sa.String(78)


def upgrade() -> None:
    op.create_table(
        "chain_cursors",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("block_number", sa.BigInteger(), nullable=True),
        sa.Column("block_hash", sa.String(66), nullable=True),
        sa.Column("block_time", sa.BigInteger(), nullable=True),
        sa.Column("final_number", sa.BigInteger(), nullable=True),
        sa.Column("lease_owner", sa.String(32), nullable=True),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_table(
        "chain_blocks",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("number", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("hash", sa.String(66), nullable=False),
        sa.Column("parent_hash", sa.String(66), nullable=False),
        sa.Column("time", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "chain_logs",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("block_hash", sa.String(66), primary_key=True),
        sa.Column("log_index", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("block_number", sa.BigInteger(), nullable=False),
        sa.Column("tx_hash", sa.String(66), nullable=False),
        sa.Column("address", sa.String(42), nullable=False),
        sa.Column("instance", sa.String(42), nullable=True),
        sa.Column("event", sa.String(32), nullable=False),
        sa.Column("account", sa.String(42), nullable=True),
        sa.Column("topics", sa.Text(), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
    )
    op.create_index("ix_chain_logs_block", "chain_logs", ["chain_id", "block_number"])
    op.create_index("ix_chain_logs_account", "chain_logs", ["chain_id", "instance", "account"])
    op.create_table(
        "chain_token_counters",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("instance", sa.String(42), primary_key=True),
        sa.Column("tree_positions", sa.BigInteger(), nullable=False),
        sa.Column("fees_usdt", AMOUNT, nullable=False),
        sa.Column("gwt_minted", AMOUNT, nullable=False),
    )
    op.create_table(
        "chain_positions",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("instance", sa.String(42), primary_key=True),
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("activated", sa.Boolean(), nullable=False),
        sa.Column("active_until", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "chain_earnings",
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("instance", sa.String(42), primary_key=True),
        sa.Column("address", sa.String(42), primary_key=True),
        sa.Column("level", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("amount", AMOUNT, nullable=False),
    )
    op.create_table(
        "chain_flow_alerts",
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), primary_key=True,
                  autoincrement=False),
        sa.Column("threshold", AMOUNT, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "chain_flow_alert_states",
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), primary_key=True,
                  autoincrement=False),
        sa.Column("chain_id", sa.BigInteger(), primary_key=True, autoincrement=False),
        sa.Column("below", sa.Boolean(), nullable=False),
    )


def downgrade() -> None:
    for table in ("chain_flow_alert_states", "chain_flow_alerts", "chain_earnings",
                  "chain_positions", "chain_token_counters", "chain_logs", "chain_blocks",
                  "chain_cursors"):
        op.drop_table(table)
