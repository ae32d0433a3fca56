"""marketplace: agents, tags, tool prices, ranking history, ratings, runs, earnings,
subscriptions

Revision ID: marketplace_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "marketplace_0001"
down_revision = None
branch_labels = ("marketplace",)
depends_on = "core_0001"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _agent_fk() -> sa.ForeignKey:
    return sa.ForeignKey("marketplace_agents.id")


def upgrade() -> None:
    op.create_table(
        "marketplace_agents",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("slug", sa.String(64), nullable=False, unique=True),
        sa.Column("owner_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("description", sa.Text(), nullable=False),
        sa.Column("agent_template", sa.String(64), nullable=False),
        sa.Column("instructions", sa.Text(), nullable=False),
        sa.Column("monetization", sa.JSON(), nullable=False),
        sa.Column("premium", sa.Boolean(), nullable=False),
        sa.Column("linked_token", sa.String(64), nullable=True),
        sa.Column("source_project", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("runs_count", sa.BigInteger(), nullable=False),
        sa.Column("earned_micro", sa.BigInteger(), nullable=False),
        sa.Column("rating_sum", sa.BigInteger(), nullable=False),
        sa.Column("rating_count", sa.BigInteger(), nullable=False),
        sa.Column("trending_log2", sa.Float(), nullable=True),
    )
    op.create_index("ix_marketplace_agents_owner_id", "marketplace_agents", ["owner_id"])
    op.create_table(
        "marketplace_agent_tags",
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), primary_key=True),
        sa.Column("tag", sa.String(32), primary_key=True),
    )
    op.create_index("ix_marketplace_agent_tags_tag", "marketplace_agent_tags",
                    ["tag", "agent_id"])
    op.create_table(
        "marketplace_tool_prices",
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), primary_key=True),
        sa.Column("tool", sa.String(64), primary_key=True),
        sa.Column("per_call_micro", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "marketplace_rank_entries",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("sort", sa.String(16), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), nullable=False),
        sa.Column("score", sa.BigInteger(), nullable=False),
        sa.Column("valid_from", sa.BigInteger(), nullable=False),
        sa.Column("valid_to", sa.BigInteger(), nullable=False),
    )
    op.create_index("ix_marketplace_rank_entries_order", "marketplace_rank_entries",
                    ["sort", "score", "agent_id", "valid_from", "valid_to"])
    op.create_index("ix_marketplace_rank_entries_agent", "marketplace_rank_entries",
                    ["agent_id", "sort", "valid_to"])
    op.create_index("ix_marketplace_rank_entries_valid_to", "marketplace_rank_entries",
                    ["valid_to"])
    op.create_table(
        "marketplace_ratings",
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), primary_key=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("stars", sa.SmallInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "marketplace_runs",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("run_id", sa.String(40), nullable=False, unique=True),
        sa.Column("stream", sa.String(80), nullable=False),
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=True),
        sa.Column("prices", sa.JSON(), nullable=False),
        sa.Column("tool_calls", sa.Integer(), nullable=False),
        sa.Column("charged_micro", sa.BigInteger(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_marketplace_runs_agent_user", "marketplace_runs",
                    ["agent_id", "user_id"])
    op.create_table(
        "marketplace_earnings",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("payer_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("tool", sa.String(64), nullable=True),
        sa.Column("run_id", sa.String(40), nullable=True),
        sa.Column("subscription_id", sa.BigInteger(), nullable=True),
        sa.Column("amount_micro", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_marketplace_earnings_owner_id", "marketplace_earnings", ["owner_id"])
    op.create_table(
        "marketplace_subscriptions",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("agent_id", sa.BigInteger(), _agent_fk(), nullable=False),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=True),
        sa.Column("price_micro", sa.BigInteger(), nullable=False),
        sa.Column("period_days", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("renew", sa.Boolean(), nullable=False),
        sa.Column("period_start", sa.DateTime(timezone=True), nullable=False),
        sa.Column("period_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_reason", sa.String(32), nullable=True),
        sa.UniqueConstraint("agent_id", "user_id",
                            name="uq_marketplace_subscriptions_agent_user"),
    )
    op.create_index("ix_marketplace_subscriptions_due", "marketplace_subscriptions",
                    ["status", "period_end"])


def downgrade() -> None:
    for table in ("marketplace_subscriptions", "marketplace_earnings", "marketplace_runs",
                  "marketplace_ratings", "marketplace_rank_entries", "marketplace_tool_prices",
                  "marketplace_agent_tags", "marketplace_agents"):
        op.drop_table(table)
