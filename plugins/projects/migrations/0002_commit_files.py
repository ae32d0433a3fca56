"""projects: the files of every commit a run made (contents in chunks, commits, file lists)
and the screenshots runs took

Revision ID: projects_0002
Revises: projects_0001

Commits made before this revision are not in these tables: a project's next run stores the
head of the workspace it finds on its host (``engine.commit_store.sync_workspace``).
"""

import sqlalchemy as sa
from alembic import op

revision = "projects_0002"
down_revision = "projects_0001"
branch_labels = None
depends_on = None

Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "project_blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size", sa.BigInteger(), nullable=False),
    )
    op.create_table(
        "project_blob_chunks",
        sa.Column("sha256", sa.String(64), sa.ForeignKey("project_blobs.sha256"),
                  primary_key=True),
        sa.Column("seq", sa.Integer(), primary_key=True),
        sa.Column("content", sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        "project_commits",
        sa.Column("id", Id, primary_key=True, autoincrement=True),
        sa.Column("project_id", sa.BigInteger(), sa.ForeignKey("projects.id"),
                  nullable=False),
        sa.Column("sha", sa.String(64), nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("git_object", sa.LargeBinary(), nullable=False),
        sa.Column("total_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("project_id", "sha", name="uq_project_commits_project_sha"),
    )
    op.create_table(
        "project_commit_files",
        sa.Column("commit_id", sa.BigInteger(), sa.ForeignKey("project_commits.id"),
                  primary_key=True),
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column("mode", sa.Integer(), nullable=False),
        sa.Column("blob", sa.String(64), sa.ForeignKey("project_blobs.sha256"),
                  nullable=False),
    )
    op.create_table(
        "project_screenshots",
        sa.Column("project_id", sa.BigInteger(), sa.ForeignKey("projects.id"),
                  primary_key=True),
        sa.Column("path", sa.Text(), primary_key=True),
        sa.Column("blob", sa.String(64), sa.ForeignKey("project_blobs.sha256"),
                  nullable=False),
        sa.Column("run_id", sa.String(40), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("project_screenshots")
    op.drop_table("project_commit_files")
    op.drop_table("project_commits")
    op.drop_table("project_blob_chunks")
    op.drop_table("project_blobs")
