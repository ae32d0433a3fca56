"""Tables of the marketplace plugin.

Columns naming a user (``owner_id``, ``user_id``, ``payer_id``) refer to the core's users
table; that foreign key lives in the migration, as the table is not part of this MetaData.

FLOW amounts are BigInteger micro-FLOW. ``marketplace_rank_entries`` is the ranking
history the listing pages through: one row per (agent, sort, score value) with the
interval of microsecond Unix times during which the agent had that score while
published (``valid_to`` is ``OPEN`` for the current value); see ``ranking.py``.
"""

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
)

from runtime.users import Id

metadata = MetaData()

agents = Table(
    "marketplace_agents", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("slug", String(64), nullable=False, unique=True),
    Column("owner_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("name", String(100), nullable=False),
    Column("description", Text, nullable=False),
    Column("agent_template", String(64), nullable=False),
    Column("instructions", Text, nullable=False),
    Column("monetization", JSON, nullable=False),
    Column("premium", Boolean, nullable=False),
    Column("linked_token", String(64), nullable=True),
    Column("source_project", String(64), nullable=True),
    Column("status", String(16), nullable=False),
    Column("published_at", DateTime(timezone=True), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
    Column("runs_count", BigInteger, nullable=False),
    Column("earned_micro", BigInteger, nullable=False),
    Column("rating_sum", BigInteger, nullable=False),
    Column("rating_count", BigInteger, nullable=False),
    Column("trending_log2", Float, nullable=True),
)

agent_tags = Table(
    "marketplace_agent_tags", metadata,
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), primary_key=True),
    Column("tag", String(32), primary_key=True),
    Index("ix_marketplace_agent_tags_tag", "tag", "agent_id"),
)

tool_prices = Table(
    "marketplace_tool_prices", metadata,
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), primary_key=True),
    Column("tool", String(64), primary_key=True),
    Column("per_call_micro", BigInteger, nullable=False),
)

rank_entries = Table(
    "marketplace_rank_entries", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("sort", String(16), nullable=False),
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), nullable=False),
    Column("score", BigInteger, nullable=False),
    Column("valid_from", BigInteger, nullable=False),
    Column("valid_to", BigInteger, nullable=False),
    # The listing scans this index in (score, agent_id) order and filters validity from
    # the index alone, so a page costs the same at any depth.
    Index("ix_marketplace_rank_entries_order", "sort", "score", "agent_id", "valid_from",
          "valid_to"),
    Index("ix_marketplace_rank_entries_agent", "agent_id", "sort", "valid_to"),
    Index("ix_marketplace_rank_entries_valid_to", "valid_to"),
)

ratings = Table(
    "marketplace_ratings", metadata,
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), primary_key=True),
    Column("stars", SmallInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

runs = Table(
    "marketplace_runs", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("run_id", String(40), nullable=False, unique=True),
    Column("stream", String(80), nullable=False),
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), nullable=False),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False),
    Column("key_id", BigInteger, nullable=True),
    Column("prices", JSON, nullable=False),
    Column("tool_calls", Integer, nullable=False),
    Column("charged_micro", BigInteger, nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=False),
    Index("ix_marketplace_runs_agent_user", "agent_id", "user_id"),
)

earnings = Table(
    "marketplace_earnings", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), nullable=False),
    Column("owner_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("payer_id", BigInteger, ForeignKey("users.id"), nullable=False),
    Column("key_id", BigInteger, nullable=True),
    Column("kind", String(16), nullable=False),
    Column("tool", String(64), nullable=True),
    Column("run_id", String(40), nullable=True),
    Column("subscription_id", BigInteger, nullable=True),
    Column("amount_micro", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

subscriptions = Table(
    "marketplace_subscriptions", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("agent_id", BigInteger, ForeignKey("marketplace_agents.id"), nullable=False),
    Column("user_id", BigInteger, ForeignKey("users.id"), nullable=False),
    Column("key_id", BigInteger, nullable=True),
    Column("price_micro", BigInteger, nullable=False),
    Column("period_days", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("renew", Boolean, nullable=False),
    Column("period_start", DateTime(timezone=True), nullable=False),
    Column("period_end", DateTime(timezone=True), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("ended_at", DateTime(timezone=True), nullable=True),
    Column("end_reason", String(32), nullable=True),
    UniqueConstraint("agent_id", "user_id", name="uq_marketplace_subscriptions_agent_user"),
    Index("ix_marketplace_subscriptions_due", "status", "period_end"),
)
