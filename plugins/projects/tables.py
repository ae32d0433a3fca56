"""Tables of the projects plugin: projects, runs, stream events, subscribers, and the
files of every commit a run made (``engine.commit_store``)."""

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)

metadata = MetaData()
Id = BigInteger().with_variant(Integer, "sqlite")
# ``users.id`` is the core's table and ``tokens.slug`` the chain plugin's (its token
# registry): the string references resolve in the combined MetaData of the service (schema
# checks) and in the migrations, which create the constraints.

projects = Table(
    "projects", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("slug", String(64), nullable=False, unique=True),
    Column("token_slug", String(64), ForeignKey("tokens.slug"), nullable=False, index=True),
    Column("owner_id", BigInteger, ForeignKey("users.id"), nullable=False, index=True),
    Column("title", String(120), nullable=False),
    Column("brief", Text, nullable=False),
    Column("agent_template", String(64), nullable=False),
    Column("private", Boolean, nullable=False),
    Column("status", String(16), nullable=False),
    # The token's slug while the project is active (idle, queued or running), NULL once it
    # reaches an end status: the unique index keeps one active project per token, across
    # every service process, without a lock.
    Column("active_token", String(64), nullable=True, unique=True),
    Column("last_run_id", String(40), nullable=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

runs = Table(
    "project_runs", metadata,
    Column("id", String(40), primary_key=True),
    Column("stream", String(80), nullable=False, index=True),
    Column("project_id", BigInteger, ForeignKey("projects.id"), nullable=True, index=True),
    Column("owner_id", BigInteger, ForeignKey("users.id"), nullable=False),
    Column("template", String(64), nullable=False),
    Column("key_id", BigInteger, nullable=True),
    Column("priority", Integer, nullable=False),
    Column("status", String(16), nullable=False),
    Column("reason", Text, nullable=True),
    Column("sha", String(64), nullable=True),
    Column("worker", String(32), nullable=False),
    Column("lease_until", DateTime(timezone=True), nullable=False, index=True),
    Column("queued_at", DateTime(timezone=True), nullable=False),
    Column("started_at", DateTime(timezone=True), nullable=True),
    Column("ended_at", DateTime(timezone=True), nullable=True),
)

stream_heads = Table(
    "project_stream_heads", metadata,
    Column("stream", String(80), primary_key=True),
    Column("last_seq", BigInteger, nullable=False),
)

stream_events = Table(
    "project_stream_events", metadata,
    Column("stream", String(80), primary_key=True),
    Column("seq", BigInteger, primary_key=True),
    Column("run_id", String(40), nullable=False),
    Column("name", String(32), nullable=False),
    Column("data", Text, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

subscribers = Table(
    "project_subscribers", metadata,
    Column("project_id", BigInteger, ForeignKey("projects.id"), primary_key=True),
    Column("user_id", BigInteger, ForeignKey("users.id"), primary_key=True),
    Column("created_at", DateTime(timezone=True), nullable=False),
)

# The files of every commit a run made, so that any host serves them (``engine.commit_store``):
# contents once per distinct file (by SHA-256, shared by every commit and project holding
# it), and per commit its raw git object and the list of its files. A content is stored in
# chunks, so that a download reads (and PostgreSQL decompresses) each part once.
blobs = Table(
    "project_blobs", metadata,
    Column("sha256", String(64), primary_key=True),
    Column("size", BigInteger, nullable=False),
)

blob_chunks = Table(
    "project_blob_chunks", metadata,
    Column("sha256", String(64), ForeignKey("project_blobs.sha256"), primary_key=True),
    Column("seq", Integer, primary_key=True),
    Column("content", LargeBinary, nullable=False),
)

commits = Table(
    "project_commits", metadata,
    Column("id", Id, primary_key=True, autoincrement=True),
    Column("project_id", BigInteger, ForeignKey("projects.id"), nullable=False),
    Column("sha", String(64), nullable=False),
    Column("run_id", String(40), nullable=False),
    # ``git cat-file commit <sha>``: a host rebuilding the workspace writes it back, so the
    # rebuilt repository's HEAD has the very sha the stream announced.
    Column("git_object", LargeBinary, nullable=False),
    Column("total_bytes", BigInteger, nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
    UniqueConstraint("project_id", "sha", name="uq_project_commits_project_sha"),
)

commit_files = Table(
    "project_commit_files", metadata,
    Column("commit_id", BigInteger, ForeignKey("project_commits.id"), primary_key=True),
    Column("path", Text, primary_key=True),
    Column("mode", Integer, nullable=False),
    Column("blob", String(64), ForeignKey("project_blobs.sha256"), nullable=False),
)

# The screenshots runs took, by project and work-tree path, stored with their ``screenshot``
# event: the event's URL works on every host before any commit holds the picture.
screenshots = Table(
    "project_screenshots", metadata,
    Column("project_id", BigInteger, ForeignKey("projects.id"), primary_key=True),
    Column("path", Text, primary_key=True),
    Column("blob", String(64), ForeignKey("project_blobs.sha256"), nullable=False),
    Column("run_id", String(40), nullable=False),
    Column("created_at", DateTime(timezone=True), nullable=False),
)
