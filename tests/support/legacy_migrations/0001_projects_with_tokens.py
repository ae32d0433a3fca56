# projects_0001 as released before the token registry moved to the chain plugin (commit
# 599beee), verbatim: it created the ``tokens`` table. tests/plugins/chain/
# test_token_registry.py migrates a database with it, then upgrades it with the current
# revisions.
"""projects: tokens, projects, runs, stream events, subscribers

Revision ID: projects_0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "projects_0001"
down_revision = None
branch_labels = ("projects",)
depends_on = "core_0001"

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
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
    op.create_table(
        "projects",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("slug", sa.String(64), nullable=False, unique=True),
        sa.Column("token_slug", sa.String(64), sa.ForeignKey("tokens.slug"), nullable=False),
        sa.Column("owner_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("title", sa.String(120), nullable=False),
        sa.Column("brief", sa.Text(), nullable=False),
        sa.Column("agent_template", sa.String(64), nullable=False),
        sa.Column("private", sa.Boolean(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("active_token", sa.String(64), nullable=True, unique=True),
        sa.Column("last_run_id", sa.String(40), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_projects_token_slug", "projects", ["token_slug"])
    op.create_index("ix_projects_owner_id", "projects", ["owner_id"])
    op.create_table(
        "project_runs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("stream", sa.String(80), nullable=False),
        sa.Column("project_id", sa.BigInteger(), sa.ForeignKey("projects.id"), nullable=True),
        sa.Column("owner_id", sa.BigInteger(), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("template", sa.String(64), nullable=False),
        sa.Column("key_id", sa.BigInteger(), nullable=True),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("sha", sa.String(64), nullable=True),
        sa.Column("worker", sa.String(32), nullable=False),
        sa.Column("lease_until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("queued_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index("ix_project_runs_stream", "project_runs", ["stream"])
    op.create_index("ix_project_runs_project_id", "project_runs", ["project_id"])
    op.create_index("ix_project_runs_lease_until", "project_runs", ["lease_until"])
    op.create_table(
        "project_stream_heads",
        sa.Column("stream", sa.String(80), primary_key=True),
        sa.Column("last_seq", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "project_stream_events",
        sa.Column("stream", sa.String(80), primary_key=True),
        sa.Column("seq", sa.BigInteger(), primary_key=True),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("name", sa.String(32), nullable=False),
        sa.Column("data", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "project_subscribers",
        sa.Column("project_id", sa.BigInteger(), sa.ForeignKey("projects.id"),
                  primary_key=True),
        sa.Column("user_id", sa.BigInteger(), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_subscribers")
    op.drop_table("project_stream_events")
    op.drop_table("project_stream_heads")
    op.drop_table("project_runs")
    op.drop_table("projects")
    op.drop_table("tokens")
